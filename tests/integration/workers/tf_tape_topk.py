"""Worker: a custom training loop with DistributedGradientTape and the daemon's top-k
(sparsify=TopK), eagerly for 5 steps, then 5 steps in a tf.function. Writes the final weights,
the losses and the first step's reduced gradient to $OUT_DIR/rank<r>.npz."""

import os

import numpy as np
import tensorflow as tf

import keras
import sparsync.tensorflow as hvd

tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
DENSITY = float(os.environ.get("TOPK_DENSITY", "0.05"))

keras.utils.set_random_seed(r)  # different on every rank until the broadcast
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="tanh"),
                          keras.layers.Dense(1)])
optimizer = keras.optimizers.SGD(0.05)
optimizer.build(model.trainable_variables)
hvd.broadcast_variables(model.variables, root_rank=0)
rng = np.random.default_rng(100 + r)  # each rank's own data
x = tf.constant(rng.normal(size=(32, 64)).astype(np.float32))
y = tf.reduce_sum(x[:, :8], axis=1, keepdims=True)


def step():
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
    tape = hvd.DistributedGradientTape(tape, sparsify=hvd.TopK(density=DENSITY))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss, grads


graph_step = tf.function(step)
losses, first = [], None
for i in range(10):
    loss, grads = step() if i < 5 else graph_step()
    losses.append(float(loss))
    if first is None:
        first = grads[0].numpy()
out = {"losses": np.array(losses), "first_grad": first}
for i, w in enumerate(model.get_weights()):
    out["w%d" % i] = w
np.savez(os.path.join(os.environ["OUT_DIR"], "rank%d.npz" % r), **out)
hvd.shutdown()
print("worker %d of %d done: losses %s" % (r, n, losses))
