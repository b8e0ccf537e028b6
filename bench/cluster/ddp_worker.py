"""The torch.distributed peers of the cluster benchmark: DDP (gloo) over a replayed backward.

DistributedDataParallel wraps a ReplayModule (replay_module.py): its hooks see the gradients
arrive in the profile's backward order, so its buckets are all-reduced while the replayed
backward goes on, as in real training; backward() returns when every bucket is reduced. With
--powersgd-rank R the buckets go through PyTorch's PowerSGD communication hook (Vogels et al.,
NeurIPS 2019) at rank R instead, with its defaults otherwise (error feedback, warm start,
vectors and small tensors all-reduced uncompressed), compressing from the third iteration on;
one bucket's exchange starts when the previous one's has ended (one_bucket_at_a_time: Gloo).
Iterations are timed as in replay_worker.py (same JSON fields).

Run one process per node, with torch.distributed's environment, e.g.

    MASTER_ADDR=198.18.0.1 MASTER_PORT=29500 RANK=0 WORLD_SIZE=4 GLOO_SOCKET_IFNAME=spsc-v0 \\
        ddp_worker.py --profile resnet50 --warmup 7 --iters 20 --out /tmp/run/w{rank}.json
"""

import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

import model_profile
from replay_module import ReplayModule

# PowerSGD's vanilla all-reduce phase: the fewest iterations its error feedback allows (> 1).
POWERSGD_START_ITER = 2


def one_bucket_at_a_time(hook):
    """The communication hook, each bucket started once the previous bucket's result is in.

    Gloo pairs the ranks' collectives by the order they are issued. PowerSGD issues its second
    and third all-reduce (P, then Q) from completion callbacks, which on a slow backward race
    with the next bucket's first all-reduce, issued from the autograd thread; ranks then pair
    different collectives and Gloo aborts ("op.preamble.length <= op.nbytes"). Chaining the
    buckets keeps every rank's order the same; the exchange still overlaps the backward.
    """
    last = [None]

    def run(state, bucket):
        out = torch.futures.Future()

        def start(_=None):
            try:
                fut = hook(state, bucket)
            except Exception as e:  # noqa: BLE001 (handed to DDP through the future)
                out.set_exception(e)
                return

            def finish(f):
                try:
                    out.set_result(f.value())
                except Exception as e:  # noqa: BLE001
                    out.set_exception(e)
            fut.add_done_callback(finish)

        previous, last[0] = last[0], out
        if previous is None:
            start()
        else:
            previous.add_done_callback(start)
        return out
    return run


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
    p.add_argument("--powersgd-rank", type=int, default=0,
                   help="reduce through PyTorch's PowerSGD hook at this rank (default 0: off)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random gradients")
    p.add_argument("--timeout-s", type=float, default=300.0, help="gloo collective timeout")
    p.add_argument("--out", default="-",
                   help="result file ({rank} is replaced by the rank; - for stdout)")
    args = p.parse_args(argv)
    if args.powersgd_rank < 0:
        p.error("--powersgd-rank must be >= 0")
    if args.powersgd_rank and args.warmup < POWERSGD_START_ITER:
        p.error("--warmup must be at least %d with PowerSGD (it compresses from iteration %d)"
                % (POWERSGD_START_ITER, POWERSGD_START_ITER))
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
    if args.powersgd_rank:
        state = powerSGD_hook.PowerSGDState(process_group=None,
                                            matrix_approximation_rank=args.powersgd_rank,
                                            start_powerSGD_iter=POWERSGD_START_ITER)
        ddp.register_comm_hook(state, one_bucket_at_a_time(powerSGD_hook.powerSGD_hook))
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
    result = {
        "worker": "ddp_powersgd" if args.powersgd_rank else "ddp", "rank": rank, "size": size,
        "model": profile["model"],
        "profile": str(model_profile.resolve(args.profile)), "num_tensors": len(schedule),
        "total_numel": schedule.total_numel, "time_scale": args.time_scale,
        "forward": not args.no_forward,
        "replayed_forward_s": schedule.forward_s if not args.no_forward else 0.0,
        "replayed_backward_s": schedule.backward_s, "bucket_mb": args.bucket_mb,
        "powersgd_rank": args.powersgd_rank,
        "warmup": args.warmup, "iters": args.iters,
    }
    model_profile.write_result(result, rows, args.warmup, args.out)
    # No destroy_process_group(): with the PowerSGD hook a rank sometimes hung in it after every
    # rank had finished (seen in the dilated runs and in CI's loopback test). The barrier above
    # has synchronised the ranks; leaving ends the Gloo group as well.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
