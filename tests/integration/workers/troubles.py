"""Worker: the hangs of docs/operations.md's troubleshooting section ($TROUBLE).

TROUBLE=names:  the last node's workers allreduce 'fc2.bias' where the others allreduce
                'fc2.weight' (a model built differently on one node): each waits for the other.
TROUBLE=uneven: the last node's workers run 2 steps, the others 3 (a data loader of another
                length), then every worker averages its loss, as a training script does at the
                end of an epoch.
TROUBLE=early:  the same, but the last node's workers end after their 2 steps.
TROUBLE=reinit: every worker allreduces 'a'; the last node's workers then call shutdown() and
                init() again and write OUT_DIR/back; the others wait for that file and 6 s,
                post 'b' and write OUT_DIR/posted, after which the last node's post 'b' too.
Writes OUT_DIR/rank<r>.json: the error each worker got (None: none) and how long it waited.
"""

import json
import os
import time

import torch

import sparsync
import sparsync.torch as hvd

hvd.init()
r = hvd.rank()
last_node = r >= hvd.size() - hvd.local_size()
hvd.allreduce(torch.ones(3), name="warmup")
case = os.environ["TROUBLE"]
result = {"rank": r, "error": None}
start = time.monotonic()
try:
    if case == "names":
        hvd.allreduce(torch.ones(8), name="fc2.bias" if last_node else "fc2.weight")
    elif case in ("uneven", "early"):
        for step in range(2 if last_node else 3):
            hvd.allreduce(torch.ones(8), name="fc1.weight")
        if not (last_node and case == "early"):
            hvd.allreduce(torch.ones(1), name="loss")
    elif case == "reinit":
        hvd.allreduce(torch.ones(4), name="a")
        back, posted = (os.path.join(os.environ["OUT_DIR"], f) for f in ("back", "posted"))

        def wait_for(path):
            while not os.path.exists(path) and time.monotonic() - start < 60:
                time.sleep(0.05)

        x = torch.full((4,), float(r))
        if last_node:
            hvd.shutdown()
            hvd.init()
            open(back, "w").close()
            wait_for(posted)
            out = hvd.allreduce(x, name="b", op=hvd.Sum)
        else:
            wait_for(back)
            # Posted past the coordinator's grace period (5 s) for a rank that is away, before
            # the returned rank posts it: 'b' completes only if the news of the return came.
            time.sleep(6.0)
            handle = hvd.allreduce_async(x, name="b", op=hvd.Sum)
            open(posted, "w").close()
            out = hvd.synchronize(handle)
        result["b"] = out.tolist()
    else:
        raise SystemExit("unknown TROUBLE=%s" % case)
except sparsync.SparsyncError as e:
    result["error"] = str(e)
result["elapsed_s"] = time.monotonic() - start
with open(os.path.join(os.environ["OUT_DIR"], "rank%d.json" % r), "w") as f:
    json.dump(result, f)
print(result, flush=True)
