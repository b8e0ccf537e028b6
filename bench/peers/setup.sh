#!/usr/bin/env bash
# Installs the cluster benchmark's peers (bench/cluster/harness.py modes hvd_*) into an
# environment of their own, bench/peers/.venv: Horovod 0.28.1 from PyPI, built with Gloo (no MPI,
# no TensorFlow, no MXNet) against Debian's python3-torch. The venv sees the system site packages
# (torch, numpy), so nothing else is downloaded. Needs root for the one Debian package it adds:
# libtorch-dev, the C++ headers Horovod's torch extension compiles against.
#
# Neither the default install (deploy/install_deps.sh) nor CI needs this; only the peer modes of
# the cluster benchmark do. The build compiles Horovod's C++ core and takes a while on 2 cores
# (MAKEFLAGS=-j2). Idempotent: a second run only checks that horovod.torch imports with Gloo.
#
#     bash bench/peers/setup.sh     # harness.py's hvd_* modes then find bench/peers/.venv
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv="$here/.venv"
version=0.28.1

check() {
  "$venv/bin/python" - <<'EOF'
import horovod, horovod.torch as hvd
assert hvd.gloo_built(), "horovod was built without Gloo"
print("peers: horovod %s (gloo %s, mpi %s) with torch %s"
      % (horovod.__version__, hvd.gloo_built(), hvd.mpi_built(), __import__("torch").__version__))
EOF
}

if [[ -x "$venv/bin/python" ]] && check 2>/dev/null; then
  exit 0
fi

if ! dpkg-query -W -f='${Status}' libtorch-dev 2>/dev/null | grep -q "install ok installed"; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "peers: Debian's libtorch-dev is missing; run this script as root" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends libtorch-dev
fi
for tool in cmake g++; do
  if ! command -v "$tool" >/dev/null; then
    echo "peers: $tool is missing (deploy/install_deps.sh)" >&2
    exit 1
  fi
done

if [[ ! -x "$venv/bin/python" ]]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
# Horovod's setup.py imports torch to find its headers and ABI; --no-build-isolation lets it see
# Debian's torch through the system site packages. cloudpickle, psutil, pyyaml and packaging are
# Horovod's own run-time requirements (Debian ships some of them; pip fills in the rest).
"$venv/bin/python" -m pip install -q "setuptools<70" wheel
HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
  HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j2 \
  "$venv/bin/python" -m pip install --no-cache-dir --no-build-isolation "horovod==$version"
check
