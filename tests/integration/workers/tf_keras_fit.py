"""Worker: Keras model.fit for 20 steps, distributed (every rank takes its slice of each global
batch) or, with argument 'single', in one process on the concatenated batches (no sparsync).
Writes the final weights and the epoch's loss to $OUT_DIR/<rank|single>.npz. Distributed, it also
saves the model, loads it back with hvd.load_model and trains 2 more steps."""

import os
import sys

import numpy as np
import tensorflow as tf

import keras

SINGLE = len(sys.argv) > 1 and sys.argv[1] == "single"
RANKS = int(os.environ.get("FIT_RANKS", "4"))
BATCH, STEPS, FEATURES, CLASSES = 8, 20, 10, 3
tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)

rng = np.random.default_rng(0)
x = rng.normal(size=(STEPS * RANKS * BATCH, FEATURES)).astype(np.float32)
y = rng.integers(0, CLASSES, size=STEPS * RANKS * BATCH).astype(np.int32)


def model_with_seed(seed):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(CLASSES)])
    return m


loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
if SINGLE:
    model = model_with_seed(0)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
    history = model.fit(x, y, batch_size=RANKS * BATCH, epochs=1, shuffle=False, verbose=0)
    np.savez(os.path.join(os.environ["OUT_DIR"], "single.npz"),
             loss=history.history["loss"][0], *model.get_weights())
    sys.exit(0)

import sparsync.tensorflow.keras as hvd  # noqa: E402

hvd.init()
r, n = hvd.rank(), hvd.size()
assert n == RANKS, (n, RANKS)
# Rank r's rows of every global batch, in step order.
rows = np.concatenate([np.arange(s * n * BATCH + r * BATCH, s * n * BATCH + (r + 1) * BATCH)
                       for s in range(STEPS)])
model = model_with_seed(r)  # different on every rank: the broadcast makes them rank 0's
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=loss)
callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
             hvd.callbacks.MetricAverageCallback()]
history = model.fit(x[rows], y[rows], batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                    callbacks=callbacks)
out = os.environ["OUT_DIR"]
np.savez(os.path.join(out, "rank%d.npz" % r), loss=history.history["loss"][0],
         *model.get_weights())

path = os.path.join(out, "model%d.keras" % r)
model.save(path)
loaded = hvd.load_model(path)
assert getattr(type(loaded.optimizer), "_sparsync_distributed", False), type(loaded.optimizer)
assert type(loaded.optimizer).__name__ == "SGD", type(loaded.optimizer)
# Each rank continues on data of its own: the averaged gradients keep the weights equal.
loaded.fit(x[rows][:2 * BATCH] * (r + 1), y[rows][:2 * BATCH], batch_size=BATCH, epochs=1,
           shuffle=False, verbose=0)
plain = keras.models.load_model(path)  # saved as a plain SGD: loads without sparsync
assert type(plain.optimizer) is keras.optimizers.SGD, type(plain.optimizer)
np.savez(os.path.join(out, "loaded%d.npz" % r), *loaded.get_weights())
hvd.shutdown()
print("worker %d of %d done" % (r, n))
