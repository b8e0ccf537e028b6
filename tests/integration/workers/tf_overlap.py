"""Worker: gradients are reduced while backward goes on, shown causally rather than by timing.

The model is x -> Dense(8) -> Gate -> Dense(3). Backward produces the output layer's gradients
first; the Gate's backward then blocks until this rank holds the output kernel's *reduced*
gradient (a Compression whose decompress, which runs on the reduced gradient, marks the step),
and only then lets backward continue into the first layer. If the shim posted the gradients only
once all of them existed, the step could not be marked before the Gate let go: the Gate waits
GATE_WAIT_S and the step is recorded as not overlapped. MODE=tape: a DistributedGradientTape in a
tf.function; MODE=fit: model.fit with hvd.DistributedOptimizer. The gate holds from step
FIRST_GATED on (the daemon's first steps run with fixed buckets, which fuse every gradient, until
its layer-wise plan is in force). Writes {"waited_s": [...], "overlapped": [...]} per gated step
to $OUT_DIR/rank<r>.json."""

import json
import os
import threading
import time

import numpy as np
import tensorflow as tf

import keras
import sparsync.tensorflow as hvd
import sparsync.tensorflow.keras as hvd_keras

MODE = os.environ["MODE"]
STEPS, FIRST_GATED, GATE_WAIT_S = 5, 3, 10.0
OUTPUT_KERNEL = (8, 3)  # the shape that tells the output kernel's gradient apart

tf.config.threading.set_inter_op_parallelism_threads(4)  # the gate holds one thread
tf.config.threading.set_intra_op_parallelism_threads(1)
hvd.init()
r = hvd.rank()


class Gate:
    """What the gate's backward and the marking decompress share (Python state: the graph's
    numpy_functions run in this process): the step in progress, the last step whose output
    kernel gradient was reduced (per step, so that a late mark of one step cannot open the
    next step's gate), and what each gated step saw."""

    def __init__(self):
        self.cv = threading.Condition()
        self.step = 0
        self.reduced_step = 0
        self.waited_s, self.overlapped = [], []

    def mark(self, t):
        with self.cv:
            self.reduced_step = self.step
            self.cv.notify_all()
        return t

    def release(self, upstream):
        if self.step >= FIRST_GATED:
            if not all(self.overlapped):  # failed once: the test fails, do not wait again
                self.overlapped.append(False)
                self.waited_s.append(0.0)
                return upstream
            start = time.monotonic()
            with self.cv:
                ok = self.cv.wait_for(lambda: self.reduced_step == self.step, GATE_WAIT_S)
            self.overlapped.append(ok)
            self.waited_s.append(time.monotonic() - start)
        return upstream


gate = Gate()


class Marking(hvd.Compression.none):
    """Compression none that marks the step when the output kernel's reduced gradient is there."""

    @staticmethod
    def compress(tensor):
        return tensor, tuple(tensor.shape) == OUTPUT_KERNEL

    @staticmethod
    def decompress(tensor, is_output_kernel):
        if not is_output_kernel:
            return tensor
        # Not stateful: a stateful op would be chained after the gate's by program order.
        return tf.numpy_function(gate.mark, [tensor], tensor.dtype, stateful=False)


class GateLayer(keras.layers.Layer):
    def call(self, x):
        @tf.custom_gradient
        def gated(v):
            def grad(upstream):
                return tf.numpy_function(gate.release, [upstream], upstream.dtype,
                                         stateful=False)
            return tf.identity(v), grad
        return gated(x)


keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                          GateLayer(), keras.layers.Dense(3)])
rng = np.random.default_rng(r)
x = rng.normal(size=(16 * STEPS, 4)).astype(np.float32)
y = rng.normal(size=(16 * STEPS, 3)).astype(np.float32)

if MODE == "tape":
    optimizer = keras.optimizers.SGD(0.01)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb) - yb))
        tape = hvd.DistributedGradientTape(tape, compression=Marking)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    for s in range(STEPS):
        gate.step = s + 1
        step(x[16 * s:16 * (s + 1)], y[16 * s:16 * (s + 1)])
else:
    class Counter(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            gate.step = batch + 1

    model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.01),
                                                           compression=Marking),
                  loss="mse")
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[Counter()])

assert len(gate.overlapped) == STEPS - FIRST_GATED + 1, gate.overlapped
with open(os.path.join(os.environ["OUT_DIR"], "rank%d.json" % r), "w") as f:
    json.dump({"waited_s": gate.waited_s, "overlapped": gate.overlapped}, f)
hvd.shutdown()
