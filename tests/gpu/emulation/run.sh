#!/usr/bin/env bash
# Runs the CUDA kernel tests (tests/unit/kernels/cuda/) on the CPU, through the emulation of the
# CUDA execution model in include/cuda_emulation.h: a logic check of kernels/cuda/ for machines
# without a GPU. Not a substitute for tests/gpu/device_check.sh: blocks run one at a time, there
# is no timing, and device arithmetic is the host's. It did find a warp race that a GPU would
# show only now and then.
#
#   tests/gpu/emulation/run.sh [gtest arguments]   # e.g. --gtest_filter='*TopK*'
#   tests/gpu/emulation/run.sh --plugin [gtest arguments]
#
# --plugin runs sparsify_plugin_test instead, against the daemon's CUDA sparsification library
# (kernels/cuda/sparsify_plugin.cc over the same translated kernels) built as an emulated shared
# library, as ctest runs it against the CPU fake: the real library's C interface, on the CPU.
#
# Builds into build-cuda-emulation/ (the CPU kernels with -DSPARSYNC_CUDA=OFF, then the .cu files
# rewritten by translate_launches.py and compiled as C++ with g++), needs an installed GoogleTest
# and x86-64. The whole suite takes about 5 minutes on one core (run in $JOBS shards, default 2).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../../.." && pwd)
here="$repo/tests/gpu/emulation"
out="$repo/build-cuda-emulation"
jobs=${JOBS:-2}
plugin=0
if [[ "${1:-}" == "--plugin" ]]; then
  plugin=1
  shift
fi
mkdir -p "$out/src" "$out/obj"
rm -f "$out/compile-failed"

cmake -S "$repo/kernels" -B "$out/kernels" -G Ninja -DSPARSYNC_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$out/kernels.log"
cmake --build "$out/kernels" --target sparsync_kernels >>"$out/kernels.log"

# -fPIC: the same objects go into the emulated plugin (--plugin).
cxx=(g++ -std=c++20 -O2 -g -pthread -fPIC -Wall -Wextra -Wno-unused-parameter
     -Wno-unknown-pragmas -I"$here/include" -I"$repo")
sources=()
for cu in select threshold random aggregate; do
  python3 "$here/translate_launches.py" "$repo/kernels/cuda/$cu.cu" "$out/src/$cu.cc"
  sources+=("$out/src/$cu.cc")
done
sources+=("$repo/kernels/cuda/workspace.cc" "$repo/kernels/cuda/cuda_status.cc")
if (( plugin )); then
  sources+=("$repo/kernels/cuda/sparsify_plugin.cc")
else
  for t in topk selection aggregate workspace; do
    sources+=("$repo/tests/unit/kernels/cuda/${t}_test.cc")
  done
fi
objects=()
for src in "${sources[@]}"; do
  obj="$out/obj/$(basename "$src").pic.o"
  objects+=("$obj")
  newer_header=""
  [[ -f "$obj" ]] &&
    newer_header=$(find "$repo/kernels" "$here/include" "$repo/tests/unit/kernels" \
    -newer "$obj" \( -name '*.h' -o -name '*.cuh' \) -print -quit)
  if [[ ! -f "$obj" || "$src" -nt "$obj" || -n "$newer_header" ]]; then
    # The test files at -O1 -g1 (as in the CMake trees: GoogleTest code, compiled in half the
    # time), the kernels at -O2. A failed compile is marked, since waiting on background jobs
    # does not report it.
    level=()
    [[ $src == "$repo/tests/"* ]] && level=(-O1 -g1)
    { "${cxx[@]}" "${level[@]}" -c "$src" -o "$obj" ||
      { rm -f "$obj"; touch "$out/compile-failed"; }; } &
  fi
  while (( $(jobs -rp | wc -l) >= jobs )); do wait -n || true; done
done
wait
if [[ -e "$out/compile-failed" ]]; then
  echo "emulation: a source failed to compile (errors above)" >&2
  exit 1
fi
if (( plugin )); then
  "${cxx[@]}" -shared -o "$out/libsparsync_sparsify_emulated.so" "${objects[@]}" \
    "$out/kernels/libsparsync_kernels.a" \
    -Wl,--version-script="$repo/kernels/cuda/sparsify_plugin.map" -Wl,--no-undefined
  "${cxx[@]}" -O1 -g1 -o "$out/sparsify_plugin_emulated_test" \
    "$repo/tests/unit/kernels/sparsify_plugin_test.cc" "$out/kernels/libsparsync_kernels.a" \
    -lgtest_main -lgtest -ldl
  echo "running sparsify_plugin_test on the emulated CUDA sparsification library" >&2
  SPARSYNC_TEST_SPARSIFY_PLUGIN="$out/libsparsync_sparsify_emulated.so" \
    "$out/sparsify_plugin_emulated_test" "$@"
  exit
fi
"${cxx[@]}" -o "$out/kernels_cuda_emulated_test" "${objects[@]}" \
  "$out/kernels/libsparsync_kernels.a" -lgtest_main -lgtest
# The emulation runs on one thread: the tests run in $jobs GoogleTest shards side by side (4.5
# minutes in one on CI's 2 cores), each shard's output shown once all are done.
echo "running the CUDA kernel tests under emulation ($jobs shards)" >&2
pids=()
for ((i = 0; i < jobs; i++)); do
  GTEST_TOTAL_SHARDS=$jobs GTEST_SHARD_INDEX=$i "$out/kernels_cuda_emulated_test" "$@" \
    >"$out/shard-$i.log" 2>&1 &
  pids+=($!)
done
failed=0
for ((i = 0; i < jobs; i++)); do
  wait "${pids[$i]}" || failed=1
  echo "-- shard $((i + 1)) of $jobs" >&2
  cat "$out/shard-$i.log"
done
exit "$failed"
