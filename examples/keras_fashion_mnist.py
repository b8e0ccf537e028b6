"""Fashion-MNIST with a small CNN in Keras, data-parallel through sparsync (Horovod's Keras API).

    .venv-tf/bin/sparsyncrun -np 4 python examples/keras_fashion_mnist.py

Reads the Debian package files of dataset-fashion-mnist (no downloads). Each worker fits on its
own shard; DistributedOptimizer averages the gradients through the daemons (with their
SPARSYNC_COMPRESSOR; top-k by default); rank 0 prints the per-epoch loss (averaged over the
workers by MetricAverageCallback) and the test accuracy.
"""

import argparse
import gzip
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras  # noqa: E402
import sparsync.tensorflow.keras as hvd  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path, offset):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def load(split):
    images = read_idx("%s/%s-images-idx3-ubyte.gz" % (DATA, split), 16).reshape(-1, 28, 28, 1)
    labels = read_idx("%s/%s-labels-idx1-ubyte.gz" % (DATA, split), 8)
    return (images.astype(np.float32) / 255.0 - 0.2860) / 0.3530, labels.astype(np.int32)


def net():
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="per worker")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate per worker; "
                   "scaled by sqrt(number of workers)")
    p.add_argument("--warmup-epochs", type=float, default=0,
                   help="LearningRateWarmupCallback over this many epochs (0: none)")
    args = p.parse_args()

    tf.config.threading.set_intra_op_parallelism_threads(1)  # several workers share few cores
    tf.config.threading.set_inter_op_parallelism_threads(2)
    hvd.init()
    keras.utils.set_random_seed(hvd.rank())  # BroadcastGlobalVariablesCallback makes it rank 0's
    rank, size = hvd.rank(), hvd.size()

    train_x, train_y = load("train")
    test_x, test_y = load("t10k")
    order = np.random.default_rng(1234).permutation(len(train_x))
    shard = order[rank::size]
    steps = (len(train_x) // size) // args.batch_size  # the same on every worker
    shard = shard[:steps * args.batch_size]

    model = net()
    lr = args.lr * size ** 0.5
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(lr)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback()]
    if args.warmup_epochs:
        callbacks.append(hvd.callbacks.LearningRateWarmupCallback(lr, args.warmup_epochs))
    if rank == 0:
        print("Fashion-MNIST (Keras %s, TensorFlow %s) on %d workers (%d nodes): %d steps/epoch "
              "of %d x %d images" % (keras.__version__, tf.__version__, size, hvd.cross_size(),
                                     steps, size, args.batch_size))

    class Report(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.start = time.monotonic()

        def on_epoch_end(self, epoch, logs=None):
            test = np.arange(rank, len(test_x), size)
            pred = np.argmax(self.model.predict(test_x[test], batch_size=500, verbose=0), axis=1)
            correct = hvd.allreduce(tf.constant([int(np.sum(pred == test_y[test]))], tf.int64),
                                    op=hvd.Sum, name="test_correct")
            if rank == 0:
                print("epoch %d: train loss %.4f, test accuracy %.2f %% (%.1f s)"
                      % (epoch + 1, logs["loss"], 100.0 * int(correct[0]) / len(test_x),
                         time.monotonic() - self.start), flush=True)

    model.fit(train_x[shard], train_y[shard], batch_size=args.batch_size, epochs=args.epochs,
              shuffle=True, verbose=0, callbacks=callbacks + [Report()])
    hvd.shutdown()


if __name__ == "__main__":
    main()
