#!/usr/bin/env bash
# Fashion-MNIST, 4 simulated nodes, the same number of epochs for every compressor: test accuracy
# and wall time per compressor in one Markdown table (examples/torch_fashion_mnist.py).
#   bench/fashion_mnist_compressors.sh [epochs] [density]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
epochs=${1:-2}
density=${2:-0.01}
echo "| compressor | density | epochs | test accuracy after each epoch (%) | wall (s) |"
echo "|---|---:|---:|---|---:|"
for c in none topk gtopk randomk threshold gaussiank wangni dgc; do
  d=$density
  [[ $c == none ]] && d=-
  start=$(date +%s)
  out=$(SPARSYNC_COMPRESSOR=$c SPARSYNC_DENSITY=${density} SPARSYNC_LOG_LEVEL=warn \
        "$repo/.venv/bin/sparsyncrun" -np 4 "$repo/.venv/bin/python" \
        "$repo/examples/torch_fashion_mnist.py" --epochs "$epochs" 2>&1)
  wall=$(( $(date +%s) - start ))
  acc=$(grep -oE "test accuracy [0-9.]+" <<<"$out" | awk '{print $3}' | paste -sd' ' -)
  echo "| $c | $d | $epochs | ${acc:-failed} | $wall |"
done
