"""Horovod peers of the cluster benchmark (Gloo), over a replayed backward (replay_module.py).

Modes:
  dense  hvd.DistributedOptimizer with Horovod's defaults (Tensor Fusion, 128 MiB buffer, 1 ms
         cycle): each gradient's allreduce is queued from its hook as backward makes it ready;
         the iteration ends when synchronize() has every result.
  fp16   the same with compression=hvd.Compression.fp16 (float16 on the wire).
  topk   TopK-SGD the way the OMGS-SGD authors ran it as their baseline: after backward, the
         whole model's gradient plus its residual in one vector, the top-k magnitudes
         (k = density x elements; torch.topk, exact), the values (float32) and indices (int32,
         as the authors' code sends them) through two hvd.allgather calls, scatter-added into
         the gradients and averaged; what was not sent stays in the residual (error feedback).

Run one process per node with the environment Horovod's Gloo launcher gives each process
(HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT, HOROVOD_RANK, ...; harness.py sets it, hvd_rendezvous.py is
the server), under the peers' Python (bench/peers/setup.sh):

    horovod_worker.py --mode dense --profile resnet50_pipedream --warmup 7 --iters 20 \\
        --out /tmp/run/w{rank}.json

Iterations are timed as in replay_worker.py (same JSON fields); topk adds the per-iteration
selection time ("select_s": residual, torch.topk, and with --select-cost the padding to a
fitted GPU cost, as the daemons' SPARSYNC_EMULATE_SELECT_COST).
"""

import argparse
import math
import os
import sys
import time

import torch

import model_profile
from replay_module import ReplayModule

MODES = ("dense", "fp16", "topk")


class TopK:
    """One top-k over the whole model after backward, exchanged by allgather (TopK-SGD).

    The gradients are views of one flat vector (as DDP's gradient_as_bucket_view has them), so
    that the model's gradient needs no concatenation. The selection is exact: each chunk's
    top-k, then the top-k of their union, which are the elements torch.topk of the whole
    vector selects (up to ties), with temporaries of one chunk instead of the whole model's:
    eight copies of the ImageNet VGG-16 baseline must fit in this machine's memory.
    """

    CHUNK = 1 << 23

    def __init__(self, hvd, params, density, select_cost=0.0):
        self.hvd, self.params = hvd, list(params)
        self.select_cost = select_cost
        self.numel = sum(p.numel() for p in self.params)
        self.k = max(1, int(density * self.numel))
        self.flat = torch.zeros(self.numel)
        offset = 0
        for p in self.params:
            p.grad = self.flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        self.residual = torch.zeros(self.numel)
        self.select_s = 0.0

    def _top_indices(self, acc):
        if self.numel <= self.CHUNK:
            return torch.topk(acc.abs(), self.k, sorted=False)[1]
        values, indices = [], []
        for start in range(0, self.numel, self.CHUNK):
            part = acc[start:start + self.CHUNK].abs()
            v, i = torch.topk(part, min(self.k, part.numel()), sorted=False)
            values.append(v)
            indices.append(i.add_(start))
        _, j = torch.topk(torch.cat(values), self.k, sorted=False)
        return torch.cat(indices)[j]

    def reduce(self):
        t = time.perf_counter()
        acc = self.residual.add_(self.flat)
        idx = self._top_indices(acc)
        values = acc[idx]
        acc[idx] = 0.0  # what is sent leaves the residual
        if self.select_cost > 0 and self.numel > 1:
            # As the daemons' SPARSYNC_EMULATE_SELECT_COST: the selection lasts as long as the
            # modelled GPU's would (the CPU's own time counts), so that both sides of the
            # single-group comparison pay the same selection.
            pad = self.select_cost * self.numel * math.log2(self.numel)
            time.sleep(max(0.0, t + pad - time.perf_counter()))
        self.select_s = time.perf_counter() - t
        all_values = self.hvd.allgather(values, name="topk.values")
        all_indices = self.hvd.allgather(idx.to(torch.int32), name="topk.indices")
        self.flat.zero_()  # the gradients' views see the result
        self.flat.index_add_(0, all_indices.to(torch.int64), all_values)
        self.flat.div_(self.hvd.size())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", required=True, choices=MODES)
    p.add_argument("--profile", required=True, help="model name in bench/profiles/ or a path")
    p.add_argument("--iters", type=int, default=20, help="measured iterations (default 20)")
    p.add_argument("--warmup", type=int, default=7, help="unmeasured iterations (default 7)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiplies the profile's forward and backward times (default 1)")
    p.add_argument("--no-forward", action="store_true", help="skip the forward wait")
    p.add_argument("--density", type=float, default=0.001, help="topk: fraction sent")
    p.add_argument("--select-cost", type=float, default=0.0,
                   help="topk: the selection of n elements lasts at least this x n log2 n wall "
                        "seconds (a fitted GPU cost, already times the dilation; default 0: "
                        "torch.topk's own time)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random gradients")
    p.add_argument("--out", default="-",
                   help="result file ({rank} is replaced by the rank; - for stdout)")
    args = p.parse_args(argv)
    if args.iters < 1 or args.warmup < 1:
        p.error("--iters and --warmup must be >= 1")
    if not 0 < args.density <= 1:
        p.error("--density must be in (0, 1]")
    if args.select_cost < 0:
        p.error("--select-cost must be >= 0")
    import horovod
    import horovod.torch as hvd

    profile = model_profile.load(args.profile)
    schedule = model_profile.Schedule(profile, args.time_scale)
    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    module = ReplayModule(schedule, args.seed + 1000003 * rank, not args.no_forward)
    optimizer, topk = None, None
    if args.mode == "topk":
        topk = TopK(hvd, module.parameters(), args.density, args.select_cost)
    else:
        compression = hvd.Compression.fp16 if args.mode == "fp16" else hvd.Compression.none
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(module.parameters(), lr=0.0),
                                             named_parameters=module.named_parameters(),
                                             compression=compression)
    h = torch.zeros(())
    rows, select = [], []
    for _ in range(args.warmup + args.iters):
        module.clock.lag = 0.0
        t0 = time.perf_counter()
        out = module(h)
        module.clock.start = time.perf_counter()
        out.backward()
        if topk is not None:
            topk.reduce()
            select.append(topk.select_s)
        else:
            optimizer.synchronize()  # every gradient reduced; the update itself is not timed
        end = time.perf_counter()
        rows.append((end - t0, end - module.clock.start, module.clock.lag,
                     end - (module.clock.start + schedule.backward_s)))
    hvd.allreduce(torch.zeros(1), name="harness.done")  # nobody leaves while others reduce
    result = {
        "worker": "hvd_" + args.mode, "rank": rank, "size": size, "model": profile["model"],
        "profile": str(model_profile.resolve(args.profile)), "num_tensors": len(schedule),
        "total_numel": schedule.total_numel, "time_scale": args.time_scale,
        "forward": not args.no_forward,
        "replayed_forward_s": schedule.forward_s if not args.no_forward else 0.0,
        "replayed_backward_s": schedule.backward_s, "warmup": args.warmup, "iters": args.iters,
        "horovod": horovod.__version__,
        "horovod_env": {k: v for k, v in sorted(os.environ.items())
                        if k.startswith("HOROVOD_") and "RENDEZVOUS" not in k},
    }
    if topk is not None:
        result.update({"density": args.density, "k": topk.k, "select_cost": args.select_cost,
                       "select_s": select[args.warmup:]})
    model_profile.write_result(result, rows, args.warmup, args.out)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
