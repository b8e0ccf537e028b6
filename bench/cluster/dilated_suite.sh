#!/usr/bin/env bash
# The issue-15 measurements of the time-dilated cluster (bench/RESULTS.md): one harness
# invocation per table, each at modelled 1 Gb/s, density 0.001, dilation D, with sparsync's modes
# and the peers on the GPU-speed profiles, then report.py's tables and charts. Records the load
# average (`uptime`) before and after every table (the machine is shared) and the commit measured.
#
#     bench/cluster/dilated_suite.sh D OUT_DIR [TABLE...]
#
# TABLE: vgg16_imagenet, cifar, alexnet, inception_v4, lstm_ptb, resnet50, p16 (default: all, in
# that order). Others: sweep (D = 1, 3, 10, 20 whatever D says) and sweep40 (D = 40, the modes
# that still moved from 10 to 20), the dilation sweep on ResNet-50; resnet50_peers, the sweep's
# modes beside the peers it leaves out; dense_merge, sparsync's dense with 64 MiB buckets
# (Horovod-style) instead of its default plan (optimal), beside Horovod; vgg16_imagenet_p4 (P = 4:
# at P = 8 eight daemons' top-k state does not fit in 24 GiB) and vgg16_imagenet_peers;
# sparse_more, sparsync's sparse modes alone on AlexNet, the PTB LSTM and Inception-v4 (their
# dense and peer rows are the long ones). SUITE_HARNESS_ARGS, if set, is appended to every
# harness invocation, so it overrides a table's options (e.g. "--prefix bd15 --iters 3"). Needs
# root, a built daemon (build/daemon/sparsyncd) and bench/peers/setup.sh.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
if (($# < 2)); then
  sed -n '2,18p' "$0" >&2
  exit 2
fi
d=$1
out=$2
shift 2
tables=("$@")
read -r -a extra <<<"${SUITE_HARNESS_ARGS:-}"
((${#tables[@]})) || tables=(vgg16_imagenet cifar alexnet inception_v4 lstm_ptb resnet50 p16)
mkdir -p "$out"
py="$repo/.venv/bin/python"
all="dense,layerwise,single,omgs,optimal,ddp,ddp_powersgd,hvd_dense,hvd_fp16,hvd_topk"
sparse="layerwise,single,omgs,optimal"
six="resnet20_flops,vgg16_flops,resnet50_pipedream,alexnet_pipedream,inception_v4_flops"
six="$six,lstm_ptb_flops"

run() {  # name, then harness arguments
  local name=$1
  shift
  echo "== $name: start $(uptime)" | tee -a "$out/load.log"
  echo "== $name: commit $(git -C "$repo" describe --always --dirty --abbrev=40)" |
    tee -a "$out/load.log"
  "$py" "$repo/bench/cluster/harness.py" --dilation "$d" --rate 1gbit --density 0.001 \
    --plan-warmup-steps 3 --out "$out/$name.json" --run-dir "/tmp/spsc-$name" "$@" \
    ${extra[@]+"${extra[@]}"} || true
  echo "== $name: end $(uptime)" | tee -a "$out/load.log"
  "$py" "$repo/bench/cluster/report.py" "$out/$name.json" --md "$out/$name.md" \
    --png "$out/$name.png"
}

for t in "${tables[@]}"; do
  case $t in
    sweep) run sweep --models resnet50_pipedream --nodes 8 --dilation 1,3,10,20 \
      --modes dense,layerwise,single,omgs,optimal,hvd_dense,hvd_topk --iters 5 \
      --measure-bandwidth ;;
    sweep40) run sweep40 --models resnet50_pipedream --nodes 8 --dilation 40 \
      --modes layerwise,single --iters 5 ;;
    cifar) run cifar --models resnet20_flops,vgg16_flops --nodes 8 --modes "$all" --iters 10 \
      --measure-bandwidth ;;
    resnet50) run resnet50 --models resnet50_pipedream --nodes 8 --modes "$all" --iters 5 ;;
    dense_merge) run dense_merge --models resnet50_pipedream --nodes 8 \
      --modes dense,hvd_dense --dense-merge fixed:64MiB --iters 5 ;;
    resnet50_peers) run resnet50_peers --models resnet50_pipedream --nodes 8 \
      --modes single,omgs,ddp,ddp_powersgd,hvd_fp16,hvd_topk --iters 5 ;;
    vgg16_imagenet_p4) run vgg16_imagenet_p4 --models vgg16_imagenet_pipedream --nodes 4 \
      --modes dense,layerwise,single,omgs,optimal --iters 5 ;;
    vgg16_imagenet_peers) run vgg16_imagenet_peers --models vgg16_imagenet_pipedream \
      --nodes 8 --modes hvd_topk,hvd_dense,hvd_fp16,ddp,ddp_powersgd --iters 5 ;;
    alexnet) run alexnet --models alexnet_pipedream --nodes 8 --modes "$all" --iters 5 ;;
    sparse_more) run sparse_more --models alexnet_pipedream,lstm_ptb_flops,inception_v4_flops \
      --nodes 8 --modes "$sparse" --iters 5 ;;
    inception_v4) run inception_v4 --models inception_v4_flops --nodes 8 --modes "$all" \
      --iters 5 ;;
    lstm_ptb) run lstm_ptb --models lstm_ptb_flops --nodes 8 --modes "$all" --iters 5 ;;
    vgg16_imagenet) run vgg16_imagenet --models vgg16_imagenet_pipedream --nodes 8 \
      --modes "$all" --iters 5 ;;
    p16) run p16 --models "$six" --nodes 16 --modes "$sparse" --iters 5 --measure-bandwidth ;;
    *) echo "unknown table $t" >&2; exit 2 ;;
  esac
done
