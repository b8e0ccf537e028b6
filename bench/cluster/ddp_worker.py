"""The torch.distributed baseline of the cluster benchmark: DDP (gloo) over a replayed backward.

The module has one parameter per gradient tensor of the profile, in forward order, chained
through a custom autograd Function per tensor whose backward sleeps until that tensor's gradient
is due (model_profile.Schedule, measured from the start of backward) and then returns the
parameter's own (random, fixed-seed) values as its gradient. DistributedDataParallel's hooks see
the gradients arrive in the profile's backward order, so its buckets are all-reduced while the
replayed backward goes on, as in real training; backward() returns when every bucket is reduced.
Iterations are timed as in replay_worker.py (same JSON fields).

Run one process per node, with torch.distributed's environment, e.g.

    MASTER_ADDR=198.18.0.1 MASTER_PORT=29500 RANK=0 WORLD_SIZE=4 GLOO_SOCKET_IFNAME=spsc-v0 \\
        ddp_worker.py --profile resnet50 --warmup 7 --iters 20 --out /tmp/run/w{rank}.json
"""

import argparse
import datetime
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import model_profile


class _Clock:
    """Shared by the replay functions: when backward started and when each gradient is due."""

    def __init__(self, schedule):
        self.ready_s = schedule.ready_s
        self.start = 0.0
        self.lag = 0.0

    def wait_for(self, index):
        due = self.start + self.ready_s[index]
        while True:
            left = due - time.perf_counter()
            if left <= 0:
                break
            time.sleep(left)
        self.lag = max(self.lag, time.perf_counter() - due)


class _ReplayLayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, param, clock, index):
        ctx.clock, ctx.index = clock, index
        ctx.save_for_backward(param)
        return h.clone()

    @staticmethod
    def backward(ctx, grad_h):
        ctx.clock.wait_for(ctx.index)
        param, = ctx.saved_tensors
        return grad_h, param, None, None


class ReplayModule(torch.nn.Module):
    def __init__(self, schedule, seed, forward):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.clock = _Clock(schedule)
        self.forward_s = schedule.forward_s if forward else 0.0
        # Forward order is the reverse of backward order; DDP buckets parameters in reverse.
        self.order = list(range(len(schedule)))[::-1]
        self.params = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(schedule.shapes[i], generator=gen))
             for i in self.order])

    def forward(self, h):
        if self.forward_s:
            time.sleep(self.forward_s)
        for param, index in zip(self.params, self.order):
            h = _ReplayLayer.apply(h, param, self.clock, index)
        return h


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", required=True, help="model name in bench/profiles/ or a path")
    p.add_argument("--iters", type=int, default=20, help="measured iterations (default 20)")
    p.add_argument("--warmup", type=int, default=7, help="unmeasured iterations (default 7)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiplies the profile's forward and backward times (default 1)")
    p.add_argument("--no-forward", action="store_true", help="skip the forward wait")
    p.add_argument("--bucket-mb", type=float, default=25.0,
                   help="DDP bucket_cap_mb (default 25, DDP's own default)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random gradients")
    p.add_argument("--timeout-s", type=float, default=300.0, help="gloo collective timeout")
    p.add_argument("--out", default="-",
                   help="result file ({rank} is replaced by the rank; - for stdout)")
    args = p.parse_args(argv)
    profile = model_profile.load(args.profile)
    schedule = model_profile.Schedule(profile, args.time_scale)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=args.timeout_s))
    rank, size = dist.get_rank(), dist.get_world_size()
    module = ReplayModule(schedule, args.seed + 1000003 * rank, not args.no_forward)
    # gradient_as_bucket_view: the gradients live in DDP's buckets, no second copy of the model.
    ddp = DistributedDataParallel(module, bucket_cap_mb=args.bucket_mb,
                                  gradient_as_bucket_view=True)
    h = torch.zeros(())
    rows = []
    for _ in range(args.warmup + args.iters):
        module.clock.lag = 0.0
        t0 = time.perf_counter()
        out = ddp(h)
        module.clock.start = time.perf_counter()
        out.backward()
        end = time.perf_counter()
        rows.append((end - t0, end - module.clock.start, module.clock.lag,
                     end - (module.clock.start + schedule.backward_s)))
    dist.barrier()
    dist.destroy_process_group()
    result = {
        "worker": "ddp", "rank": rank, "size": size, "model": profile["model"],
        "profile": str(model_profile.resolve(args.profile)), "num_tensors": len(schedule),
        "total_numel": schedule.total_numel, "time_scale": args.time_scale,
        "forward": not args.no_forward,
        "replayed_forward_s": schedule.forward_s if not args.no_forward else 0.0,
        "replayed_backward_s": schedule.backward_s, "bucket_mb": args.bucket_mb,
        "warmup": args.warmup, "iters": args.iters,
    }
    model_profile.write_result(result, rows, args.warmup, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
