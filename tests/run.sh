#!/usr/bin/env bash
# The test command (README, .ci/run): installs the dependencies, builds with warnings as errors,
# runs every GoogleTest suite (ctest), the CUDA kernels' tests and the CUDA sparsification
# library's on the CPU emulation of the CUDA execution model (no GPU here or in CI: the only check
# of the kernels' logic that runs everywhere), the daemon and kernel suites again under
# AddressSanitizer and UBSan, the suites of the multi-threaded parts (executor stages, tensor
# table, coordinator, NCCL transport, device layer) under ThreadSanitizer, the multi-process
# pytest suite with real daemons (the TensorFlow shim's workers run in .venv-tf), its PyTorch
# files again under PyPI's torch 2.x (~/.cache/sparsync/venv-torch2), the libFuzzer
# targets for a fixed short time each, and three fault trials of each kind (tests/faults; they
# need root for network namespaces).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

# Each stage's heading says when it started, so that a slow run shows where its time went.
stage() { echo "== $* (at $((SECONDS / 60)) min $((SECONDS % 60)) s)"; }

bash deploy/install_deps.sh

stage "build"
cmake -S . -B build -G Ninja -DSPARSYNC_WERROR=ON
cmake --build build

# The TensorFlow op library must have been built (its tests skip when it is missing).
if [[ ${SPARSYNC_SKIP_TENSORFLOW:-0} != 1 && ! -f build/shims/tensorflow/libsparsync_tensorflow.so ]]; then
  echo "the TensorFlow op library was not built: see cmake's 'TensorFlow op library' line" >&2
  exit 1
fi

stage "GoogleTest (ctest)"
ctest --test-dir build --output-on-failure -j2

stage "CUDA kernels on the CPU emulation (tests/gpu/emulation)"
tests/gpu/emulation/run.sh --gtest_brief=1
tests/gpu/emulation/run.sh --plugin --gtest_brief=1

stage "GoogleTest under AddressSanitizer + UBSan"
cmake -S . -B build-asan -G Ninja -DSPARSYNC_SANITIZE=ON -DSPARSYNC_BUILD_BENCH=OFF -DSPARSYNC_WERROR=ON
cmake --build build-asan --target daemon_test kernels_test
# LeakSanitizer too (on by default with ASan on Linux; said explicitly so that it stays on).
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1 build-asan/tests/unit/daemon_test --gtest_brief=1
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1 build-asan/kernels/kernels_test --gtest_brief=1

stage "GoogleTest under ThreadSanitizer"
cmake -S . -B build-tsan -G Ninja -DSPARSYNC_TSAN=ON -DSPARSYNC_BUILD_BENCH=OFF -DSPARSYNC_WERROR=ON
cmake --build build-tsan --target daemon_test nccl_transport_test device_test
# tests/tsan.supp: one race inside Debian's Gloo on the failure path, and why it is left there.
for t in daemon_test nccl_transport_test device_test; do
  TSAN_OPTIONS="halt_on_error=1 suppressions=$repo/tests/tsan.supp" build-tsan/tests/unit/$t --gtest_brief=1
done

stage "pytest (multi-process, real daemons)"
.venv/bin/python -m pytest tests/integration -q
torch2_py="${SPARSYNC_TORCH2_VENV:-$HOME/.cache/sparsync/venv-torch2}/bin/python"
if "$torch2_py" -c "import torch, pytest" 2>/dev/null; then
  stage "pytest under torch $("$torch2_py" -c "import torch; print(torch.__version__)")"
  # The files whose workers drive sparsync.torch: its collectives, compressors, shared-memory
  # gradients, Horovod's names, the DDP hook and training (about 6 minutes here). The rest of the
  # suite tests the daemon, the launchers and TensorFlow, which torch's version does not touch.
  "$torch2_py" -m pytest -q tests/integration/test_torch2.py tests/integration/test_parity.py \
    tests/integration/test_ddp_hook.py tests/integration/test_training.py \
    tests/integration/test_collectives.py tests/integration/test_compressors.py \
    tests/integration/test_zero_copy.py tests/integration/test_in_place.py
else
  stage "pytest under torch 2.x: NOT RUN (no $torch2_py: deploy/install_deps.sh makes it unless SPARSYNC_TORCH2=0; see its warning)"
fi

# About 2 minutes of fuzzing (4 targets x 25 s) after building the targets with clang; the long
# runs are tests/fuzz/run.sh with more seconds (bench/RESULTS.md).
stage "libFuzzer (tests/fuzz): each target for 25 s from its seeds"
cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DSPARSYNC_FUZZ=ON -DSPARSYNC_CUDA=OFF -DSPARSYNC_BUILD_TESTS=OFF -DSPARSYNC_BUILD_BENCH=OFF
cmake --build build-fuzz --target fuzz_targets
tests/fuzz/run.sh build-fuzz 25

# Three trials of each kind with SPARSYNC_TIMEOUT_S=8 (about 2 minutes: a hung node's own
# worker gives up at the timeout plus the shims' 5 s grace, inside the 2 x 8 s the trials allow);
# the long runs are tests/faults/trials.py --trials 100 (bench/RESULTS.md). Namespaces need root.
stage "fault trials (tests/faults): 3 of each kind on 4 nodes"
if [[ $(id -u) == 0 ]]; then
  .venv/bin/python tests/faults/trials.py --trials 3 --timeout-s 8
else
  echo "skipped: the fault trials need root (network namespaces)"
fi
stage "done"
