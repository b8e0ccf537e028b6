"""Worker: the error cases of sparsync.tensorflow; writes {"error", "status", "elapsed_s"} to
$OUT_DIR/rank<r>.json. MODE=mismatch: the last rank's 'mismatched' has another shape (eager);
graph_mismatch: the same inside a tf.function; kill: rank $KILL_RANK posts 'a' of step 3 and
SIGKILLs itself; mixed: this rank uses FRAMEWORK=tensorflow or torch, and both allreduce
'shared' (the same spec) and then 'clash' (float32 from TensorFlow, float64 from torch)."""

import json
import os
import signal
import threading
import time

import numpy as np

MODE = os.environ["MODE"]
FRAMEWORK = os.environ.get("FRAMEWORK", "tensorflow")
if FRAMEWORK == "torch":
    import torch

    import sparsync.torch as hvd

    def ones(shape, dtype="float32"):
        return torch.ones(shape, dtype=getattr(torch, dtype))
else:
    import tensorflow as tf

    import sparsync.tensorflow as hvd

    def ones(shape, dtype="float32"):
        return tf.ones(shape, dtype=getattr(tf, dtype))

import sparsync  # noqa: E402

hvd.init()
r, n = hvd.rank(), hvd.size()
result = {"rank": r, "pid": os.getpid()}
with open(os.path.join(os.environ["OUT_DIR"], "pid%d" % r), "w") as f:
    f.write(str(os.getpid()))
start = time.monotonic()
try:
    # Inside the try: a worker still waiting on the warm-up when the last rank registers another
    # shape (which fails the job at once) gets the same error there.
    hvd.allreduce(ones([3]), name="warmup")
    if MODE in ("mismatch", "graph_mismatch"):
        shape = [5, 4] if r == n - 1 else [4, 4]
        if MODE == "mismatch":
            hvd.allreduce(ones(shape), name="mismatched")
        else:
            tf.function(lambda: hvd.allreduce(ones(shape), name="mismatched"))()
    elif MODE == "kill":
        victim = int(os.environ["KILL_RANK"])
        for step in range(1000):
            if step == 3:
                start = time.monotonic()
                if r == victim:
                    # Post 'a' of this step from another thread, then die before 'b'.
                    threading.Thread(target=hvd.allreduce, args=(ones([10]),),
                                     kwargs={"name": "a"}, daemon=True).start()
                    time.sleep(0.5)
                    os.kill(os.getpid(), signal.SIGKILL)
            hvd.allreduce(ones([10]), name="a")
            hvd.allreduce(ones([1000]), name="b")
    elif MODE == "mixed":
        shared = hvd.allreduce(ones([3]) * (r + 1), name="shared")
        result["shared"] = np.asarray(shared).tolist()
        start = time.monotonic()
        hvd.allreduce(ones([3], "float32" if FRAMEWORK == "tensorflow" else "float64"),
                      name="clash")
    result["error"] = None
except sparsync.SparsyncError as e:
    result.update(error=str(e), status=e.status, kind="SparsyncError")
except Exception as e:  # inside a graph: TensorFlow's error, with the same message
    result.update(error=str(e), status=None, kind=type(e).__name__)
result["elapsed_s"] = time.monotonic() - start
with open(os.path.join(os.environ["OUT_DIR"], "rank%d.json" % r), "w") as f:
    json.dump(result, f)
print(result)
