"""Worker: the learning-rate callbacks of sparsync.tensorflow.keras under model.fit; records the
optimizer's learning rate at the start of every batch to $OUT_DIR/rank<r>.npz."""

import os

import numpy as np
import tensorflow as tf

import keras
import sparsync.keras as hvd

tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)
hvd.init()
r = hvd.rank()
STEPS, EPOCHS, LR = 4, 4, 0.8


class Record(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.rates = []

    def on_train_batch_begin(self, batch, logs=None):
        self.rates.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))


def fit(schedule):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR)), loss="mse")
    record = Record()
    x = np.ones((STEPS * 2, 3), np.float32)
    model.fit(x, x[:, :1], batch_size=2, epochs=EPOCHS, verbose=0, shuffle=False,
              callbacks=[schedule, record])
    return np.array(record.rates)


warmup = fit(hvd.callbacks.LearningRateWarmupCallback(LR, warmup_epochs=2))
stairs = fit(hvd.callbacks.LearningRateScheduleCallback(LR, lambda e: 0.5 ** e, start_epoch=1,
                                                        end_epoch=3))
np.savez(os.path.join(os.environ["OUT_DIR"], "rank%d.npz" % r), warmup=warmup, stairs=stairs)
hvd.shutdown()
