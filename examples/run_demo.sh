#!/usr/bin/env bash
# The demo: installs dependencies (as root on a fresh machine), builds, and trains a small CNN on
# Fashion-MNIST with 4 workers on 4 simulated nodes (one sparsyncd each) on this machine.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
bash deploy/install_deps.sh
cmake -S . -B build -G Ninja
cmake --build build
exec .venv/bin/sparsyncrun -np 4 .venv/bin/python examples/torch_fashion_mnist.py "$@"
