"""Worker: some ranks register 'mismatched' with another shape; every worker must fail.

MISMATCH=local: only the last rank differs (from the other workers of its node as well);
MISMATCH=cross-node: every worker of the last node differs from the other nodes.
"""

import json
import os
import time

import torch

import sparsync
import sparsync.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
local = hvd.local_size()
odd = r == n - 1 if os.environ["MISMATCH"] == "local" else r >= n - local
shape = (5, 4) if odd else (4, 4)
start = time.monotonic()
result = {"rank": r}
try:
    # Inside the try: a worker still waiting on the warm-up when another node's workers differ
    # (MISMATCH=local fails the job as soon as the odd one registers) gets the same error there.
    hvd.allreduce(torch.ones(3), name="warmup")
    hvd.allreduce(torch.ones(shape), name="mismatched")
    result["error"] = None
except sparsync.SparsyncError as e:
    result.update(error=str(e), status=e.status)
result["elapsed_s"] = time.monotonic() - start
with open(os.path.join(os.environ["OUT_DIR"], "rank%d.json" % r), "w") as f:
    json.dump(result, f)
print(result)
