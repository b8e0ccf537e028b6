#!/usr/bin/env bash
# Prepares what tests/gpu/device_check.sh needs on the GPU machine but cannot download there:
# a source copy of GoogleTest (that machine has CUDA, CMake, ninja and PyTorch, but no GoogleTest
# and no internet). Run on the build machine, from anywhere:
#
#   tests/gpu/prepare.sh                 # copies /usr/src/googletest to build-gpu-deps/googletest
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
echo "prepare.sh: GoogleTest sources copied to ${dest#"$repo"/} ($(du -sh "$dest" | cut -f1));" \
     "carry build-gpu-deps to the GPU machine"
