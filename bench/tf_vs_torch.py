#!/usr/bin/env python3
"""sparsync.tensorflow against sparsync.torch and the raw client, on the same sizes, in the same
run: explicit allreduce per size, and one training step of the same MLP (Keras
train_on_batch vs torch forward/backward/step), each also without sparsync.

    .venv/bin/python bench/tf_vs_torch.py [--np 4] [--reps 30] [--rounds 3]

Each run is `sparsyncrun -np N` (one worker per simulated node, compressor none); the kinds
alternate round by round (tf, torch, client) so that the shared machine's drift hits all of
them, and the load average is recorded around every run. Rank 0 reports the median per call;
the table keeps the median over rounds. "client" is the thinnest path to the daemon (ctypes over
libsparsync_client: copy in, READY, DONE, copy out): the daemon's own time plus two copies, so a
shim's overhead is its time minus the client's. Prints Markdown.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIZES = [1 << 10, 1 << 16, 1 << 20, 1 << 22]  # float32 elements
LAYERS = [784, 1024, 1024, 10]  # the MLP of the training step (1.86 M parameters)
BATCH = 32
PYTHONS = {"tf": REPO / ".venv-tf" / "bin" / "python", "torch": REPO / ".venv" / "bin" / "python",
           "client": REPO / ".venv" / "bin" / "python"}


def median_time(fn, reps, warmup=3):
    times = []
    for i in range(reps + warmup):
        t0 = time.perf_counter()
        fn()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def tf_worker(reps):
    import numpy as np
    import tensorflow as tf

    import keras
    import sparsync.tensorflow.keras as hvd
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    hvd.init()
    out = {"allreduce": {}}
    for n in SIZES:
        x = tf.fill([n], float(hvd.rank() + 1))
        out["allreduce"][n] = median_time(lambda: hvd.allreduce(x, name="bench.%d" % n).numpy(),
                                          reps)
    rng = np.random.default_rng(0)
    xb = rng.normal(size=(BATCH, LAYERS[0])).astype(np.float32)
    yb = rng.integers(0, LAYERS[-1], size=BATCH)

    def model(distributed):
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((LAYERS[0],))] +
                             [keras.layers.Dense(k, activation="relu") for k in LAYERS[1:-1]] +
                             [keras.layers.Dense(LAYERS[-1])])
        opt = keras.optimizers.SGD(0.01)
        m.compile(optimizer=hvd.DistributedOptimizer(opt) if distributed else opt,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return m

    for key, distributed in (("step_local", False), ("step", True)):
        m = model(distributed)
        out[key] = median_time(lambda: m.train_on_batch(xb, yb), reps)
    rank = hvd.rank()
    hvd.shutdown()
    return rank, out


def torch_worker(reps):
    import torch
    import torch.nn.functional as F

    import sparsync.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    out = {"allreduce": {}}
    for n in SIZES:
        x = torch.full((n,), float(hvd.rank() + 1))
        out["allreduce"][n] = median_time(lambda: hvd.allreduce(x, name="bench.%d" % n), reps)
    g = torch.Generator().manual_seed(0)
    xb = torch.randn(BATCH, LAYERS[0], generator=g)
    yb = torch.randint(0, LAYERS[-1], (BATCH,), generator=g)

    def model():
        torch.manual_seed(0)
        layers = []
        for a, b in zip(LAYERS[:-1], LAYERS[1:]):
            layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers[:-1])

    for key, distributed in (("step_local", False), ("step", True)):
        m = model()
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        if distributed:
            opt = hvd.DistributedOptimizer(opt, named_parameters=m.named_parameters(),
                                           sparsify=hvd.Dense())

        def step():
            opt.zero_grad()
            F.cross_entropy(m(xb), yb).backward()
            opt.step()
        out[key] = median_time(step, reps)
    rank = hvd.rank()
    hvd.shutdown()
    return rank, out


def client_worker(reps):
    import numpy as np

    from sparsync import _client as C
    s = C.WorkerSettings()
    client = C.Client(s.socket_path, s.job_token, s.local_rank, s.connect_timeout_s)
    out = {"allreduce": {}}
    for n in SIZES:
        x = np.full(n, float(client.world["rank"] + 1), np.float32)
        reg = client.register("bench.%d" % n, C.OP_ALLREDUCE, C.FLOAT32, (n,))
        region = reg.raw().view(np.float32)

        def allreduce():
            region[:] = x
            client.post(reg)
            client.wait(reg, s.wait_timeout_s)
            return region.copy()
        out["allreduce"][n] = median_time(allreduce, reps)
    client.close()
    return client.world["rank"], out


def worker(kind, reps, path):
    rank, out = {"tf": tf_worker, "torch": torch_worker, "client": client_worker}[kind](reps)
    if rank == 0:
        Path(path).write_text(json.dumps(out))


def run(kind, np_, reps, path):
    runner = REPO / ".venv" / "bin" / "sparsyncrun"
    env = dict(os.environ, SPARSYNC_COMPRESSOR="none", SPARSYNC_LOG_LEVEL="warn",
               TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1")
    before = os.getloadavg()[0]
    cmd = [str(runner), "-np", str(np_), str(PYTHONS[kind]), __file__, "--worker", kind,
           "--reps", str(reps), "--out", path]
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-3000:])
        raise SystemExit("%s run failed" % kind)
    result = json.loads(Path(path).read_text())
    result["load"] = (before, os.getloadavg()[0])
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--worker", choices=sorted(PYTHONS))
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.reps, args.out)
    runs = {k: [] for k in PYTHONS}
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.rounds):
            for kind in PYTHONS:
                runs[kind].append(run(kind, args.np, args.reps, os.path.join(d, kind + ".json")))
                print("round %d %s: load %.1f -> %.1f" % ((i + 1, kind) + tuple(
                    runs[kind][-1]["load"])), file=sys.stderr, flush=True)

    def med(kind, *keys):
        vals = []
        for r in runs[kind]:
            v = r
            for k in keys:
                v = v[str(k)] if isinstance(v, dict) and str(k) in v else v[k]
            vals.append(v)
        return statistics.median(vals) * 1e3

    loads = [x for k in runs for r in runs[k] for x in r["load"]]
    print("%d workers on %d simulated nodes, %d rounds x %d calls; load average %.1f to %.1f "
          "around the runs\n" % (args.np, args.np, args.rounds, args.reps, min(loads),
                                 max(loads)))
    print("| float32 elements | client (ms) | torch (ms) | tensorflow (ms) | torch - client | "
          "tensorflow - client | tensorflow / torch |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in SIZES:
        c, t, f = med("client", "allreduce", n), med("torch", "allreduce", n), \
            med("tf", "allreduce", n)
        print("| %d | %.3f | %.3f | %.3f | %+.3f | %+.3f | %.2f |" % (n, c, t, f, t - c, f - c,
                                                                     f / t))
    print("\n| training step, MLP %s, batch %d | local (ms) | with sparsync (ms) | added (ms) |"
          % ("-".join(map(str, LAYERS)), BATCH))
    print("|---|---:|---:|---:|")
    for kind, label in (("torch", "torch, DistributedOptimizer"),
                        ("tf", "Keras train_on_batch, DistributedOptimizer")):
        lo, st = med(kind, "step_local"), med(kind, "step")
        print("| %s | %.2f | %.2f | %+.2f |" % (label, lo, st, st - lo))


if __name__ == "__main__":
    main()
