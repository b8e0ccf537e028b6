#!/usr/bin/env bash
# GPU device check of the CUDA kernels (README, "GPU"; issue 5, item 5). On a machine with a GPU,
# CUDA, CMake, ninja and PyTorch (no gRPC, Gloo, GoogleTest or internet needed), from the
# repository root:
#
#   tests/gpu/device_check.sh              # configure + build + tests + benchmark + torch table
#   tests/gpu/device_check.sh --build-only # configure + build, then report whether a GPU is there
#
# 1. Configures kernels/ on its own (cmake -S kernels, Ninja, Release) and builds the CUDA
#    kernels, their tests (kernels_cuda_test), the benchmark (kernels_cuda_bench), the daemon's
#    plugin libsparsync_sparsify_cuda.so and its test (sparsify_plugin_test). GoogleTest is
#    built from source: $SPARSYNC_GTEST_SOURCE_DIR, else build-gpu-deps/googletest (made by
#    tests/gpu/prepare.sh on the build machine and carried over), else /usr/src/googletest.
# 2. Without a usable GPU it says so on a line starting "NO GPU:" and exits 3 after the build.
# 3. Runs kernels_cuda_test (every kernel against the reference oracles), then, when
#    compute-sanitizer is installed, its memcheck over the small tests. Then sparsify_plugin_test
#    on the real plugin with device memory (SPARSYNC_TEST_SPARSIFY_DEVICE=1): the C interface the
#    daemon loads, against the reference top-k and the host scatter-add-average, bit for bit.
# 4. Builds tests/gpu/ipc on its own and runs cuda_ipc_check: a worker process and a daemon
#    process pass a 25 M float32 tensor through the CUDA IPC intake (CudaBuffer, CudaStaging) on
#    the real runtime, 3 rounds, every value checked, and print the staging copies' bandwidth.
#    spdlog and fmt come header-only from build-gpu-deps/include if the machine lacks them.
# 5. Builds tests/gpu/nccl on its own and runs nccl_staging_bench: the daemon's NCCL transport on a
#    one-rank communicator times AllReduceSum on pageable host memory (staged through pinned and
#    device buffers) against AllReduceSumOnDevice on a cudaMalloc'd buffer, for 1 M, 25 M and
#    100 M float32 (NCCL_ITERATIONS calls each, default 10), checks that the one-rank sum leaves
#    every value unchanged, and prints the staging's cost. One rank means no network: the
#    difference is the host staging. As in sparsyncd, NCCL and the CUDA runtime are loaded at run
#    time (the runtime of step 4, and the NCCL that configuring found). NCCL comes from the CUDA
#    toolkit, the system, PyTorch's nvidia-nccl wheel or $SPARSYNC_NCCL_ROOT; without any, the step
#    says SKIPPED (not a failure).
# 6. Runs kernels_cuda_bench (1 M, 25 M, 100 M float32 at density 0.001 and 0.01) and
#    tests/gpu/torch_baseline.py, which times the torch equivalents on the same GPU and prints the
#    table: kernel, size, density, our ms, torch ms, speed-up, bound ms, ratio to bound.
# Logs and the table go to $BUILD_DIR/device_check/ and, when $OUT is set (the device tool), to
# $OUT as well. Exit status: 0 all passed; 1 a test or the benchmark failed; 2 build failed;
# 3 no GPU. Sized to finish in about 5 minutes on the H200 machine (build about 1.5 minutes).
#
# Environment: BUILD_DIR (default build-gpu-check), SPARSYNC_CUDA_ARCHITECTURES (default: the
# project's 80-real;90-real;90-virtual), BENCH_SIZES, BENCH_DENSITIES, BENCH_ITERATIONS,
# TORCH_ITERATIONS, NCCL_ITERATIONS, SPARSYNC_NCCL_ROOT, SANITIZE=0 to skip compute-sanitizer,
# BUDGET_S (default 450: the steps' timeouts shrink so that the whole check ends within it),
# CMAKE_EXTRA_ARGS, JOBS (default nproc).
set -uo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
build_only=0
[[ "${1:-}" == "--build-only" ]] && build_only=1
build=${BUILD_DIR:-build-gpu-check}
logs="$build/device_check"
start=$(date +%s)
budget=${BUDGET_S:-450}  # seconds for the whole check; the steps below share what is left
elapsed() { echo $(( $(date +%s) - start ))s; }
# Timeout for a step: at most $1 s, and leave $2 s of the budget for the steps after it.
step_timeout() {
  local left=$(( budget - ($(date +%s) - start) - $2 ))
  (( left > $1 )) && left=$1
  (( left < 10 )) && left=10
  echo "$left"
}
say() { echo "== [$(elapsed)] $*"; }
export_results() {
  if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then
    cp "$logs"/*.log "$logs"/*.txt "$logs"/*.jsonl "$OUT"/ 2>/dev/null || true
  fi
}

mkdir -p "$logs"
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
for tool in cmake ninja nvcc; do
  if ! command -v "$tool" >/dev/null; then
    echo "device_check: $tool not found" >&2
    exit 2
  fi
done
say "tools: $(cmake --version | head -1); ninja $(ninja --version); $(nvcc --version | tail -1)"

gtest_src=${SPARSYNC_GTEST_SOURCE_DIR:-}
for candidate in "$repo/build-gpu-deps/googletest" /usr/src/googletest; do
  [[ -z "$gtest_src" && -f "$candidate/CMakeLists.txt" ]] && gtest_src=$candidate
done
cmake_args=(-S kernels -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release)
[[ -n "$gtest_src" ]] && cmake_args+=(-DSPARSYNC_GTEST_SOURCE_DIR="$gtest_src")
[[ -n "${SPARSYNC_CUDA_ARCHITECTURES:-}" ]] &&
  cmake_args+=(-DSPARSYNC_CUDA_ARCHITECTURES="$SPARSYNC_CUDA_ARCHITECTURES")
# e.g. CMAKE_EXTRA_ARGS=-DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON to rehearse the GPU machine elsewhere
read -r -a extra <<<"${CMAKE_EXTRA_ARGS:-}"
cmake_args+=("${extra[@]}")

say "configure: cmake ${cmake_args[*]}"
if ! cmake "${cmake_args[@]}" >"$logs/configure.log" 2>&1; then
  tail -30 "$logs/configure.log"
  echo "device_check: configure failed (log: $logs/configure.log)"
  export_results
  exit 2
fi
grep -E "sparsync: (CUDA|nvcc)" "$logs/configure.log"
targets=(kernels_cuda_bench)
known=$(ninja -C "$build" -t targets all 2>/dev/null)  # not piped into grep -q (SIGPIPE)
if grep -q '^kernels_cuda_test:' <<<"$known"; then
  targets+=(kernels_cuda_test)
  grep -q '^sparsify_plugin_test:' <<<"$known" &&
    targets+=(sparsync_sparsify_cuda sparsify_plugin_test)
else
  echo "device_check: no kernels_cuda_test target: GoogleTest was not found and no source copy" \
       "was given (run tests/gpu/prepare.sh and carry build-gpu-deps)"
fi
if ! grep -q '^kernels_cuda_bench:' <<<"$known"; then
  echo "device_check: CUDA kernels not configured (nvcc not usable?); see $logs/configure.log"
  export_results
  exit 2
fi

jobs=${JOBS:-$(nproc)}
say "build: ${targets[*]} with $jobs jobs"
build_start=$(date +%s)
if ! cmake --build "$build" -j"$jobs" --target "${targets[@]}" >"$logs/build.log" 2>&1; then
  grep -E "error|Error" "$logs/build.log" | head -40
  echo "device_check: build failed (log: $logs/build.log)"
  export_results
  exit 2
fi
say "build done in $(( $(date +%s) - build_start ))s"

bench="$build/cuda/kernels_cuda_bench"
test_bin="$build/cuda/kernels_cuda_test"
probe=$("$bench" --sizes 1000 --densities 0.01 --iterations 1 2>&1 >/dev/null)
probe_rc=$?
if [[ $probe_rc -eq 2 ]]; then
  echo "NO GPU: ${probe#kernels_cuda_bench: } -- built only; tests and benchmark not run"
  export_results
  exit 3
fi
status=0
if [[ $probe_rc -ne 0 ]]; then  # a GPU, but a small benchmark run failed: the tests say more
  echo "device_check: the benchmark's device probe failed (rc $probe_rc): $probe"
  status=1
fi
command -v nvidia-smi >/dev/null &&
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
if [[ $build_only -eq 1 ]]; then
  say "GPU present; --build-only: stopping here"
  exit "$status"
fi

if [[ -x "$test_bin" ]]; then
  say "tests: kernels_cuda_test"
  if timeout "$(step_timeout 240 200)" "$test_bin" --gtest_brief=1 >"$logs/tests.log" 2>&1; then
    ran=$(grep -Eo '[0-9]+ tests? from [0-9]+ test suites? ran' "$logs/tests.log" | head -1)
    skipped=$(grep -Eo 'SKIPPED \] [0-9]+ tests?' "$logs/tests.log" | head -1)
    echo "kernels_cuda_test: PASSED ($ran${skipped:+; $skipped})"
  else
    status=1
    grep -E "FAILED|Failure|error" "$logs/tests.log" | head -40
    echo "kernels_cuda_test: FAILED (log: $logs/tests.log)"
  fi
  if [[ "${SANITIZE:-1}" != 0 ]] && command -v compute-sanitizer >/dev/null &&
     (( $(step_timeout 90 180) >= 60 )); then
    say "compute-sanitizer memcheck (small tests)"
    if timeout "$(step_timeout 90 180)" compute-sanitizer --tool memcheck --error-exitcode 1 \
        "$test_bin" --gtest_brief=1 --gtest_filter='CudaTest.*' >"$logs/memcheck.log" 2>&1; then
      echo "memcheck: clean"
    else
      rc=$?
      if [[ $rc -eq 124 ]]; then
        echo "memcheck: timed out (not a failure; log: $logs/memcheck.log)"
      else
        status=1
        grep -E "ERROR SUMMARY|Invalid|FAILED" "$logs/memcheck.log" | head -20
        echo "memcheck: FAILED (log: $logs/memcheck.log)"
      fi
    fi
  fi
else
  status=1
  echo "kernels_cuda_test: not built"
fi

plugin="$build/cuda/libsparsync_sparsify_cuda.so"
plugin_test="$build/sparsify_plugin_test"
if [[ -x "$plugin_test" && -f "$plugin" ]]; then
  say "tests: sparsify_plugin_test on the real plugin (${plugin#"$build"/})"
  if SPARSYNC_TEST_SPARSIFY_PLUGIN="$plugin" SPARSYNC_TEST_SPARSIFY_DEVICE=1 \
     timeout "$(step_timeout 60 160)" "$plugin_test" --gtest_brief=1 \
     >"$logs/plugin_tests.log" 2>&1; then
    ran=$(grep -Eo '[0-9]+ tests? from [0-9]+ test suites? ran' "$logs/plugin_tests.log" | head -1)
    skipped=$(grep -Eo 'SKIPPED \] [0-9]+ tests?' "$logs/plugin_tests.log" | head -1)
    if [[ -n "$skipped" ]]; then  # the probe found a GPU, so a skip is a failure here
      status=1
      echo "sparsify_plugin_test (real plugin): FAILED: ${skipped#SKIPPED ] } skipped" \
           "(log: $logs/plugin_tests.log)"
    else
      echo "sparsify_plugin_test (real plugin): PASSED ($ran)"
    fi
  else
    status=1
    grep -E "FAILED|Failure|error|Which is|Expected" "$logs/plugin_tests.log" | head -40
    echo "sparsify_plugin_test (real plugin): FAILED (log: $logs/plugin_tests.log)"
  fi
else
  status=1
  echo "sparsify_plugin_test (real plugin): not built"
fi

say "CUDA IPC intake: cuda_ipc_check (a worker and a daemon process, the real runtime)"
ipc_build="$build-ipc"
ipc_cmake=(-S tests/gpu/ipc -B "$ipc_build" -G Ninja -DCMAKE_BUILD_TYPE=Release)
[[ -d "$repo/build-gpu-deps/include/spdlog" ]] &&
  ipc_cmake+=(-DSPARSYNC_DEPS_INCLUDE="$repo/build-gpu-deps/include")
cudart=${SPARSYNC_CUDART:-}
if [[ -z "$cudart" ]]; then  # the toolkit's runtime; else the loader's own search
  cuda_home=$(dirname "$(dirname "$(command -v nvcc)")")
  for candidate in "$cuda_home"/lib64/libcudart.so "$cuda_home"/targets/*/lib/libcudart.so; do
    [[ -z "$cudart" && -e "$candidate" ]] && cudart=$candidate
  done
fi
if cmake "${ipc_cmake[@]}" >"$logs/ipc_build.log" 2>&1 &&
   cmake --build "$ipc_build" -j"$jobs" >>"$logs/ipc_build.log" 2>&1; then
  if timeout "$(step_timeout 90 170)" "$ipc_build/cuda_ipc_check" ${cudart:+--cudart "$cudart"} \
      --elements $((25 << 20)) --rounds 3 >"$logs/ipc.log" 2>&1; then
    grep "cuda_ipc_check:" "$logs/ipc.log" | tail -1
  else
    status=1
    tail -20 "$logs/ipc.log"
    echo "cuda_ipc_check: FAILED (log: $logs/ipc.log)"
  fi
else
  status=1
  grep -E "error|Error" "$logs/ipc_build.log" | head -20
  echo "cuda_ipc_check: build FAILED (log: $logs/ipc_build.log)"
fi

say "NCCL staging: nccl_staging_bench (host-staged vs on-device allreduce, one rank)"
nccl_build="$build-nccl"
nccl_cmake=(-S tests/gpu/nccl -B "$nccl_build" -G Ninja -DCMAKE_BUILD_TYPE=Release)
[[ -n "${SPARSYNC_NCCL_ROOT:-}" ]] && nccl_cmake+=(-DSPARSYNC_NCCL_ROOT="$SPARSYNC_NCCL_ROOT")
if ! cmake "${nccl_cmake[@]}" >"$logs/nccl_build.log" 2>&1; then
  if grep -q "sparsync: NCCL not found" "$logs/nccl_build.log"; then  # allowed: not a failure
    echo "nccl_staging_bench: SKIPPED: NCCL not found on this machine (neither in the CUDA" \
         "toolkit, the system paths nor PyTorch's nvidia-nccl wheel; log: $logs/nccl_build.log)"
  else
    status=1
    grep -E "error|Error" "$logs/nccl_build.log" | head -20
    echo "nccl_staging_bench: configure FAILED (log: $logs/nccl_build.log)"
  fi
elif ! timeout "$(step_timeout 120 150)" cmake --build "$nccl_build" -j"$jobs" \
    >>"$logs/nccl_build.log" 2>&1; then
  status=1
  grep -E "error|Error" "$logs/nccl_build.log" | head -20
  echo "nccl_staging_bench: build FAILED (log: $logs/nccl_build.log)"
else
  grep "sparsync: NCCL" "$logs/nccl_build.log"
  if timeout "$(step_timeout 60 150)" "$nccl_build/nccl_staging_bench" \
      ${cudart:+--cudart "$cudart"} --iterations "${NCCL_ITERATIONS:-10}" \
      --out "$logs/nccl_staging.jsonl" \
      >"$logs/nccl_staging.log" 2>&1; then
    grep "nccl_staging_bench:" "$logs/nccl_staging.log"
  else
    status=1  # a GPU is there (the probe above), so "no GPU" (exit 2) is a failure here too
    tail -20 "$logs/nccl_staging.log"
    echo "nccl_staging_bench: FAILED (log: $logs/nccl_staging.log)"
  fi
fi

say "benchmark: kernels_cuda_bench"
bench_args=(--iterations "${BENCH_ITERATIONS:-20}")
[[ -n "${BENCH_SIZES:-}" ]] && bench_args+=(--sizes "$BENCH_SIZES")
[[ -n "${BENCH_DENSITIES:-}" ]] && bench_args+=(--densities "$BENCH_DENSITIES")
if ! timeout "$(step_timeout 180 90)" "$bench" "${bench_args[@]}" >"$logs/bench.jsonl" \
    2>"$logs/bench.log"; then
  status=1
  cat "$logs/bench.log"
  echo "kernels_cuda_bench: FAILED (partial results in $logs/bench.jsonl)"
fi

say "torch baseline and table"
PYTHONUNBUFFERED=1 timeout "$(step_timeout 180 0)" python3 tests/gpu/torch_baseline.py \
  --ours "$logs/bench.jsonl" --iterations "${TORCH_ITERATIONS:-10}" 2>"$logs/torch.log" |
  tee "$logs/table.txt"
[[ ${PIPESTATUS[0]} -ne 0 ]] && { status=1; cat "$logs/torch.log"; }

say "done: $([[ $status -eq 0 ]] && echo 'all passed' || echo 'FAILURES above')"
export_results
exit $status
