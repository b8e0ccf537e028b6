"""Worker: every explicit collective of sparsync.tensorflow, eagerly and inside a tf.function,
and the gradients of the ops; writes its results to $OUT_DIR/rank<r>.npz. The allreduce cases
run under the daemon's timeline ($TIMELINE, started and stopped by hvd.start_timeline)."""

import os

import numpy as np
import tensorflow as tf

import cases
import sparsync.keras
import sparsync.tensorflow as hvd
import sparsync.tensorflow.keras

tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
out = {}
# Horovod's capability checks, and every name the three modules export.
for module in (hvd, sparsync.tensorflow.keras, sparsync.keras):
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing, (module.__name__, missing)
out["caps"] = np.array([f() for f in (hvd.gloo_built, hvd.gloo_enabled, hvd.mpi_built,
                                      hvd.mpi_enabled, hvd.nccl_built, hvd.cuda_built,
                                      hvd.rocm_built, hvd.ddl_built, hvd.ccl_built,
                                      hvd.mpi_threads_supported)])
hvd.start_timeline(os.environ["TIMELINE"])


def as_tf(case):
    shape, dtype = cases.ALLREDUCE_CASES[case]
    x = tf.constant(cases.allreduce_input(case, r))
    return tf.cast(x, tf.bfloat16) if dtype == "bfloat16" else x


def as_np(t):
    return (tf.cast(t, tf.float32) if t.dtype == tf.bfloat16 else t).numpy()


for case, (shape, dtype) in cases.ALLREDUCE_CASES.items():
    x = as_tf(case)
    y = hvd.allreduce(x, name="ar." + case)
    assert y.dtype == x.dtype and tuple(y.shape) == tuple(shape), (y.dtype, y.shape)
    out["ar." + case] = as_np(y)
# A group is recorded just after its results are delivered, so a stop that follows the last DONE
# at once can miss that group (docs/operations.md): one more collective first.
hvd.allreduce(tf.constant([0.0]), name="timeline.fence")
hvd.stop_timeline()


# Every case again, all in flight together inside one graph (names of their own).
@tf.function
def all_at_once(xs):
    return [hvd.allreduce(x, name="graph." + c) for c, x in zip(cases.ALLREDUCE_CASES, xs)]


for case, y in zip(cases.ALLREDUCE_CASES, all_at_once([as_tf(c) for c in cases.ALLREDUCE_CASES])):
    out["graph." + case] = as_np(y)

x = tf.constant(cases.allreduce_input("f32_1000", r))
out["ar.again"] = hvd.allreduce(x * 2, name="ar.f32_1000").numpy()
out["ar.sum_noname"] = hvd.allreduce(x, op=hvd.Sum).numpy()
out["ar.int64_sum"] = hvd.allreduce(tf.range(5, dtype=tf.int64) * (r + 1), op=hvd.Sum).numpy()
out["ar.int32_avg"] = hvd.allreduce(tf.constant([10 * r + 1], tf.int32), name="int_avg").numpy()
out["ar.bool_sum"] = hvd.allreduce(tf.constant([r == 0, True]), op=hvd.Sum, name="b").numpy()
out["ar.scaled"] = hvd.allreduce(tf.ones(3), name="scaled", prescale_factor=2.0,
                                 postscale_factor=0.5 * (r + 1)).numpy()
out["ar.fp16_compression"] = hvd.allreduce(
    tf.constant(cases.allreduce_input("f32_7", r)), name="fp16c",
    compression=hvd.Compression.fp16).numpy()
sparse = tf.IndexedSlices(tf.fill([1, 3], float(r)), tf.constant([r]), tf.constant([n, 3]))
reduced = hvd.allreduce(sparse, name="slices")
out["ar.slices"] = tf.convert_to_tensor(reduced).numpy()
out["grouped"] = np.stack([t.numpy() for t in hvd.grouped_allreduce(
    [tf.ones(2) * r, tf.ones(2) * 2 * r], op=hvd.Sum, name="grp")])

out["ag"] = hvd.allgather(tf.constant(cases.allgather_input(r)), name="ag").numpy()
out["ag.noname"] = hvd.allgather(tf.constant([r, r], tf.int32)).numpy()
out["ag.int8"] = hvd.allgather(tf.constant([-r], tf.int8), name="ag8").numpy()
out["ag.scalar"] = hvd.allgather(tf.constant(float(r)), name="ags").numpy()
root = n - 1
out["bc"] = hvd.broadcast(tf.constant(cases.broadcast_input(r)), root, name="bc").numpy()
out["bc.bool"] = hvd.broadcast(tf.constant([r % 2 == 1]), root, name="bcb").numpy()
v = tf.Variable(tf.fill([3, 2], float(r)), name="v")
w = tf.Variable(tf.fill([4], float(-r)), name="v")  # the same TensorFlow name
hvd.broadcast_variables([v, w], root_rank=root)
out["bc.vars"] = np.concatenate([v.numpy().ravel(), w.numpy()])
out["bc.obj"] = np.array(hvd.broadcast_object({"from": r}, root_rank=root)["from"])
out["ag.obj"] = np.array([o["r"] for o in hvd.allgather_object({"r": r})])

# Gradients of the ops, with a rank-dependent weight c = r + 1 on each rank's loss.
c = float(r + 1)
x = tf.Variable(tf.ones([5]))
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(hvd.allreduce(x, name="grad.ar") * c)
out["grad.allreduce"] = tape.gradient(loss, x).numpy()
x = tf.Variable(tf.ones([r + 1, 2]))
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(hvd.allgather(x, name="grad.ag") * c)
out["grad.allgather"] = tape.gradient(loss, x).numpy()
x = tf.Variable(tf.ones([3]))
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(hvd.broadcast(x, root, name="grad.bc") * c)
out["grad.broadcast"] = tape.gradient(loss, x).numpy()

# A tf.compat.v1.train.Optimizer wrapped: compute_gradients returns the averaged gradients.
v1 = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0))
var = tf.Variable(tf.zeros([2]), name="v1var")
pairs = v1.compute_gradients(lambda: tf.reduce_sum(var * c), var_list=[var])
out["v1.grad"] = pairs[0][0].numpy()
v1.apply_gradients(pairs)
out["v1.var"] = var.numpy()

# One name, other specs in later calls (as Horovod allows): a broadcast from each root in turn and
# an allreduce whose shape changes, with two workers per node re-registering at their own pace.
for each_root in range(n):
    got = hvd.broadcast(tf.fill([2], float(r)), each_root, name="bc.each.root").numpy()
    assert got.tolist() == [float(each_root)] * 2, (each_root, got)
for length in (3, 5, 3, 1):
    got = hvd.allreduce(tf.ones([length]) * r, op=hvd.Sum, name="reshaped").numpy()
    assert got.tolist() == [float(sum(range(n)))] * length, (length, got)

np.savez(os.path.join(os.environ["OUT_DIR"], "rank%d.npz" % r), **out)
hvd.shutdown()
print("worker %d of %d done" % (r, n))
