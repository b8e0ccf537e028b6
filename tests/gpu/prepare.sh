#!/usr/bin/env bash
# Prepares what tests/gpu/device_check.sh needs on the GPU machine but cannot download there:
# a source copy of GoogleTest, and the spdlog and fmt headers for cuda_ipc_check (that machine has
# CUDA, CMake, ninja and PyTorch, but no GoogleTest, no spdlog and no internet). Run on the build
# machine, from anywhere:
#
#   tests/gpu/prepare.sh   # /usr/src/googletest -> build-gpu-deps/googletest,
#                          # /usr/include/{spdlog,fmt} -> build-gpu-deps/include
#
# build-gpu-deps/ is ignored by git (/build*/), so nothing is committed by accident; pass it to
# the device tool as a carry path:
#
#   run(command="tests/gpu/device_check.sh", carry=["build-gpu-deps"], timeout_s=540)
#
# device_check.sh finds it there (or takes SPARSYNC_GTEST_SOURCE_DIR) and builds GoogleTest from it
# through kernels/CMakeLists.txt's -DSPARSYNC_GTEST_SOURCE_DIR.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
src=${GTEST_SOURCE:-/usr/src/googletest}
dest="$repo/build-gpu-deps/googletest"
if [[ ! -f "$src/CMakeLists.txt" ]]; then
  echo "prepare.sh: no GoogleTest sources at $src (Debian: apt-get install googletest)" >&2
  exit 1
fi
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
cp -r "$src" "$dest"
includes="$repo/build-gpu-deps/include"
rm -rf "$includes"
mkdir -p "$includes"
for header_dir in spdlog fmt; do
  if [[ ! -d "/usr/include/$header_dir" ]]; then
    echo "prepare.sh: no /usr/include/$header_dir (Debian: apt-get install libspdlog-dev)" >&2
    exit 1
  fi
  cp -r "/usr/include/$header_dir" "$includes/"
done
echo "prepare.sh: GoogleTest sources copied to ${dest#"$repo"/} ($(du -sh "$dest" | cut -f1))," \
     "spdlog and fmt headers to ${includes#"$repo"/};" \
     "carry build-gpu-deps to the GPU machine"
