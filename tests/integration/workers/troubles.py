"""Worker: the hangs of docs/operations.md's troubleshooting section ($TROUBLE).

TROUBLE=names:  the last node's workers allreduce 'fc2.bias' where the others allreduce
                'fc2.weight' (a model built differently on one node): each waits for the other.
TROUBLE=uneven: the last node's workers run 2 steps, the others 3 (a data loader of another
                length), then every worker averages its loss, as a training script does at the
                end of an epoch.
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
    elif case == "uneven":
        for step in range(2 if last_node else 3):
            hvd.allreduce(torch.ones(8), name="fc1.weight")
        hvd.allreduce(torch.ones(1), name="loss")
    else:
        raise SystemExit("unknown TROUBLE=%s" % case)
except sparsync.SparsyncError as e:
    result["error"] = str(e)
result["elapsed_s"] = time.monotonic() - start
with open(os.path.join(os.environ["OUT_DIR"], "rank%d.json" % r), "w") as f:
    json.dump(result, f)
print(result, flush=True)
