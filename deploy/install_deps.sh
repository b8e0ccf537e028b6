#!/usr/bin/env bash
# Installs everything sparsync needs to build, test and run its demo on Debian 12, as root.
# Idempotent: a second run only checks. Creates the Python environment in <repo>/.venv
# (Debian's python3 with its system packages, so Debian's python3-torch is visible) and,
# in the development set, the TensorFlow one in <repo>/.venv-tf (from PyPI, pinned).
#
#   deploy/install_deps.sh            the development set: compilers, libraries, the test tools
#                                     (OpenSSH, Slurm, munge, Prometheus, the validators)
#   deploy/install_deps.sh --runtime  only what running sparsyncd and the Python package needs
#                                     (the runtime stage of deploy/docker/Dockerfile)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
mode=dev
case "${1:-}" in
  "") ;;
  --runtime) mode=runtime ;;
  *) echo "usage: $0 [--runtime]" >&2; exit 2 ;;
esac

dev_packages=(
  build-essential cmake ninja-build pkg-config git iproute2
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libgloo-dev libspdlog-dev libcli11-dev nlohmann-json3-dev pybind11-dev libcpp-httplib-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-venv python3-pip python3-numpy python3-pytest python3-torch python3-torchvision
  python3-matplotlib
  dataset-fashion-mnist
  # The operations tests (tests/integration/test_hosts.py, test_slurm.py, test_observe.py,
  # test_deploy.py): sshd in network namespaces, a Slurm cluster with munge, Prometheus, and
  # systemd-analyze for the units.
  openssh-server openssh-client slurm-wlm munge prometheus systemd
  clang libclang-rt-14-dev openssl  # tests/fuzz (libFuzzer), the TLS tests' throwaway CA
)
# What sparsyncd and libsparsync_client.so link (their own dependencies come along), and Python.
runtime_packages=(
  libgrpc++1.51 libprotobuf32 libgloo0 libspdlog1.10 libfmt9 libcpp-httplib0.11
  python3 python3-venv python3-numpy python3-torch
)
# The offline validators of test_deploy.py, from PyPI into the venv.
dev_pip=(kubernetes-validate dockerfile)

if [[ $mode == runtime ]]; then packages=("${runtime_packages[@]}"); else packages=("${dev_packages[@]}"); fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "install_deps: missing Debian packages (${missing[*]}); run this script as root" >&2
    exit 1
  fi
  # The services these packages bring (sshd, slurmctld, slurmd, munged, prometheus) must not
  # start on installation: the tests start their own, in network namespaces.
  guard=""
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    guard=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' > "$guard"
    chmod 755 "$guard"
  fi
  echo "install_deps: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  if [[ -n $guard ]]; then rm -f "$guard"; fi
fi

# The project's Python environment: Debian's interpreter on purpose (it sees python3-torch).
if [[ ! -x "$repo/.venv/bin/python" ]]; then
  /usr/bin/python3 -m venv --system-site-packages "$repo/.venv"
fi
if [[ $mode == dev ]]; then
  for p in "${dev_pip[@]}"; do
    "$repo/.venv/bin/python" -m pip show -q "$p" >/dev/null 2>&1 ||
      "$repo/.venv/bin/python" -m pip install -q "$p"
  done
fi
"$repo/.venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$repo/shims/python"

# The TensorFlow environment <repo>/.venv-tf, for sparsync.tensorflow and its op library (CMake
# builds shims/tensorflow when it exists). A second environment because TensorFlow 2.21 needs
# numpy >= 1.26 and protobuf >= 6.31 (it brings numpy 2, protobuf 7 and Keras 3.15), which would
# shadow Debian's numpy 1.24 that Debian's torch 1.13 in .venv is built against; so it is
# Debian's python3 without the system packages. SPARSYNC_SKIP_TENSORFLOW=1 skips it.
tf_pin="tensorflow-cpu==2.21.0"
if [[ $mode == dev && ${SPARSYNC_SKIP_TENSORFLOW:-0} != 1 ]]; then
  tf_py="$repo/.venv-tf/bin/python"
  [[ -x "$tf_py" ]] || /usr/bin/python3 -m venv "$repo/.venv-tf"
  if ! "$tf_py" -c "import importlib.metadata as m; import sys; \
      sys.exit(m.version('tensorflow-cpu') != '${tf_pin#*==}')" 2>/dev/null; then
    echo "install_deps: installing $tf_pin into .venv-tf"
    "$tf_py" -m pip install -q "$tf_pin"
  fi
  "$tf_py" -m pip install -q --no-deps --no-build-isolation -e "$repo/shims/python"
fi
# The torch 2.x environment, for the PyTorch tests that tests/run.sh runs a second time there:
# PyPI's current torch. It lives outside the checkout, in $SPARSYNC_TORCH2_VENV (default
# ~/.cache/sparsync/venv-torch2), so that every clone on this machine (CI's included) reuses it;
# sparsync is not installed into it (the tests put shims/python on the path). Debian's python3
# without the system packages, so that Debian's torch 1.13 does not shadow it.
# PyPI has no CPU-only Linux torch wheel: its dependencies are about 3.5 GB of NVIDIA wheels. Most
# of those libraries are the CUDA toolkit's, and this machine has the toolkit (/usr/local/cuda),
# so by default (SPARSYNC_TORCH2=1) the wheel goes in without its dependencies, with its
# pure-Python ones and the four NVIDIA libraries the toolkit lacks: about 1 GB, a minute here.
# torch then loads the rest from the toolkit (the tests use only the CPU). Where that import
# fails (no toolkit), SPARSYNC_TORCH2=full installs every dependency; SPARSYNC_TORCH2=0 skips it.
# A failed install is reported and skips it (tests/run.sh then says the torch 2.x run did not
# happen).
torch2_pin="torch==2.15.0"
torch2_python_deps=(filelock "typing-extensions>=4.13.0" "setuptools>=77.0.3" "sympy>=1.13.3"
  "networkx>=2.5.1" jinja2 "fsspec>=0.8.5" numpy pytest)
# The pins of torch 2.15.0's own requirements (its METADATA) for the libraries the toolkit lacks.
torch2_nvidia=(nvidia-cufile==1.20.0.107 nvidia-cusparselt-cu13==0.8.1 nvidia-nccl-cu13==2.30.7
  nvidia-nvshmem-cu13==3.7.2)
torch2_venv="${SPARSYNC_TORCH2_VENV:-$HOME/.cache/sparsync/venv-torch2}"
torch2_mode=${SPARSYNC_TORCH2:-1}
if [[ $mode == dev && $torch2_mode != 0 ]]; then
  t2_py="$torch2_venv/bin/python"
  if ! "$t2_py" -c "import importlib.metadata as m; import sys, pytest, numpy, torch; \
      sys.exit(m.version('torch') != '${torch2_pin#*==}')" 2>/dev/null; then
    echo "install_deps: installing $torch2_pin into $torch2_venv"
    mkdir -p "$(dirname "$torch2_venv")"
    { [[ -x "$t2_py" ]] || /usr/bin/python3 -m venv "$torch2_venv"; } && if [[ $torch2_mode == full ]]; then
      "$t2_py" -m pip install -q "$torch2_pin" numpy pytest
    else
      # Dependencies first: pip then lists only the CUDA wheels left out as conflicts.
      "$t2_py" -m pip install -q "${torch2_python_deps[@]}" &&
        "$t2_py" -m pip install -q --no-deps "$torch2_pin" "${torch2_nvidia[@]}"
    fi || echo "install_deps: WARNING: could not install $torch2_pin; the torch 2.x tests will not run"
    if [[ -x "$t2_py" ]] && ! t2_error=$("$t2_py" -c "import torch" 2>&1 | tail -1); then
      echo "install_deps: WARNING: $torch2_pin does not import ($t2_error); the torch 2.x tests" \
        "will not run (SPARSYNC_TORCH2=full installs its CUDA libraries from PyPI)"
    fi
  fi
fi
echo "install_deps: ok"
