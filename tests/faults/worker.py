#!/usr/bin/env python3
"""A training loop without a framework, for the fault trials and the soak (tests/faults).

Each step writes three gradients (OP_GRADIENT, top-k at density 0.01 with the daemon's error
feedback) into their shared regions, posts them, waits for the averaged results and prints
"step N". The first failure is printed as one line "ERROR: <message>" and the worker exits 1;
after FAULT_STEPS steps (default: no end) it exits 0. Configured like any worker
(SPARSYNC_SOCKET, SPARSYNC_JOB_TOKEN, SPARSYNC_LOCAL_RANK, SPARSYNC_TIMEOUT_S); waits give up
after SPARSYNC_TIMEOUT_S plus 5 s, as sparsync.torch does.
"""

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "shims" / "python"))
from sparsync import _client as C  # noqa: E402
from sparsync._errors import SparsyncError  # noqa: E402
from sparsync._wire import COMPRESSOR_TOPK  # noqa: E402

SIZES = (65536, 300000, 4096)


def main():
    timeout_s = float(os.environ.get("SPARSYNC_TIMEOUT_S", "300")) + 5.0
    steps = int(os.environ.get("FAULT_STEPS", "0")) or None
    pause_s = float(os.environ.get("FAULT_STEP_PAUSE_S", "0.02"))
    rank = int(os.environ.get("SPARSYNC_RANK", "0"))
    try:
        client = C.Client(os.environ["SPARSYNC_SOCKET"],
                          os.environ.get("SPARSYNC_JOB_TOKEN") or None,
                          int(os.environ.get("SPARSYNC_LOCAL_RANK", "0")), 30.0)
        regs = [client.register("g%d" % i, C.OP_GRADIENT, C.FLOAT32, (n,),
                                compressor=COMPRESSOR_TOPK, density=0.01)
                for i, n in enumerate(SIZES)]
        rng = np.random.default_rng(rank)
        step = 0
        while steps is None or step < steps:
            step += 1
            for r in regs:
                r.array(np.float32)[:] = rng.standard_normal(r.numel, dtype=np.float32)
                client.post(r)
            for r in regs:
                client.wait(r, timeout_s)
            print("step %d" % step, flush=True)
            if pause_s > 0:
                time.sleep(pause_s)
        client.close()
    except SparsyncError as e:
        print("ERROR: %s" % e, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
