"""A custom TensorFlow 2 training loop with DistributedGradientTape (Horovod's API), on
Fashion-MNIST with an MLP, the daemon's top-k chosen for this tape.

    .venv-tf/bin/sparsyncrun -np 4 python examples/tensorflow_gradient_tape.py

The step is a tf.function: each gradient's reduction is posted as soon as backward has produced
it. Rank 0 prints the loss and, at the end, the test accuracy.
"""

import argparse
import gzip
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras  # noqa: E402
import sparsync.tensorflow as hvd  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"


def load(split):
    with gzip.open("%s/%s-images-idx3-ubyte.gz" % (DATA, split), "rb") as f:
        x = np.frombuffer(f.read(), dtype=np.uint8, offset=16).reshape(-1, 784)
    with gzip.open("%s/%s-labels-idx1-ubyte.gz" % (DATA, split), "rb") as f:
        y = np.frombuffer(f.read(), dtype=np.uint8, offset=8)
    return (x.astype(np.float32) / 255.0 - 0.2860) / 0.3530, y.astype(np.int32)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch-size", type=int, default=64, help="per worker")
    p.add_argument("--density", type=float, default=0.01, help="top-k density of this tape")
    args = p.parse_args()

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    keras.utils.set_random_seed(rank)
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(10)])
    optimizer = keras.optimizers.SGD(0.05 * size, momentum=0.9)
    optimizer.build(model.trainable_variables)
    hvd.broadcast_variables(model.variables + optimizer.variables, root_rank=0)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    x, y = load("train")
    shard = np.random.default_rng(1).permutation(len(x))[rank::size]
    data = tf.data.Dataset.from_tensor_slices((x[shard], y[shard])).repeat().shuffle(
        10000, seed=rank).batch(args.batch_size)

    @tf.function
    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape, sparsify=hvd.TopK(density=args.density))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    start = time.monotonic()
    for i, (images, labels) in enumerate(data.take(args.steps)):
        loss = step(images, labels)
        if (i + 1) % 100 == 0:
            avg = hvd.allreduce(loss, name="loss")
            if rank == 0:
                print("step %d: loss %.4f (%.1f s)" % (i + 1, float(avg),
                                                       time.monotonic() - start), flush=True)
    tx, ty = load("t10k")
    part = np.arange(rank, len(tx), size)
    correct = np.sum(np.argmax(model(tx[part]), axis=1) == ty[part])
    correct = hvd.allreduce(tf.constant([int(correct)], tf.int64), op=hvd.Sum, name="correct")
    if rank == 0:
        print("test accuracy %.2f %%" % (100.0 * int(correct[0]) / len(tx)))
    hvd.shutdown()


if __name__ == "__main__":
    main()
