"""Worker: inside a tf.function, a DistributedGradientTape's reduction of one gradient completes
while backward is still busy with another (a 1 s sleep in the backward of variable b only).
Writes when each reduced gradient became available to $OUT_DIR/rank<r>.json."""

import json
import os
import time

import tensorflow as tf

import sparsync.tensorflow as hvd

tf.config.threading.set_inter_op_parallelism_threads(4)
tf.config.threading.set_intra_op_parallelism_threads(1)
hvd.init()
r = hvd.rank()
a = tf.Variable(tf.ones([1000]), name="a")
b = tf.Variable(tf.ones([1000]), name="b")
stamps = {}


def stamp(key):
    def record(x):
        stamps[key] = time.monotonic()
        return x
    return record


@tf.custom_gradient
def slow_backward(x):
    def grad(upstream):
        # Not stateful: a tf.function chains stateful ops in program order, which would make
        # the stamps below wait for this sleep whatever the shim does.
        return tf.numpy_function(lambda u: (time.sleep(1.0), u)[1], [upstream], tf.float32,
                                 stateful=False)
    return tf.identity(x), grad


@tf.function
def step():
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(a * 2.0) + tf.reduce_sum(slow_backward(b) * 3.0)
    if os.environ.get("OVERLAP_EXPLICIT"):
        ga, gb = tape.gradient(loss, [a, b])
        ga, gb = hvd.allreduce(ga, name="x.a"), hvd.allreduce(gb, name="x.b")
    else:
        tape = hvd.DistributedGradientTape(tape)
        ga, gb = tape.gradient(loss, [a, b])
    ga = tf.numpy_function(stamp("a"), [ga], tf.float32, stateful=False)
    gb = tf.numpy_function(stamp("b"), [gb], tf.float32, stateful=False)
    return ga, gb


for i in range(4):  # the first step traces and registers; the daemon plans after it
    ga, gb = step()
    assert float(ga[0]) == 2.0 and float(gb[0]) == 3.0, (ga, gb)
with open(os.path.join(os.environ["OUT_DIR"], "rank%d.json" % r), "w") as f:
    json.dump({"a": stamps["a"], "b": stamps["b"]}, f)
hvd.shutdown()
