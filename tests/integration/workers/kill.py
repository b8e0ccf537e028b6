"""Worker: allreduce steps; rank $KILL_RANK SIGKILLs itself in the middle of step 3."""

import json
import os
import signal
import time

import torch

import sparsync
import sparsync.torch as hvd

hvd.init()
r = hvd.rank()
victim = int(os.environ["KILL_RANK"])
result = {"rank": r, "pid": os.getpid()}
with open(os.path.join(os.environ["OUT_DIR"], "pid%d" % r), "w") as f:
    f.write(str(os.getpid()))
# Timed from step 2: a survivor may hear of the death while it still waits for step 2's results
# (the victim's node had them and went on; the abort closed the connections with its last message
# to this node unread).
start = None
try:
    for step in range(1000):
        if step == 2:
            start = time.monotonic()
        if step == 3:
            if r == victim:
                # Post one tensor of the step, then die before the other.
                hvd.allreduce_async(torch.ones(10), name="a")
                os.kill(os.getpid(), signal.SIGKILL)
        hvd.allreduce(torch.ones(10), name="a")
        hvd.allreduce(torch.ones(1000), name="b")
    result["error"] = None
except sparsync.SparsyncError as e:
    result.update(error=str(e), status=e.status)
result["elapsed_s"] = time.monotonic() - start if start else None
with open(os.path.join(os.environ["OUT_DIR"], "rank%d.json" % r), "w") as f:
    json.dump(result, f)
print(result)
