"""Keras callbacks of sparsync.tensorflow.keras (Horovod's)."""

import warnings

import keras
import tensorflow as tf

from sparsync.tensorflow import _basics
from sparsync.tensorflow._collectives import allreduce, broadcast_variables


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """At the start of training, every worker takes rank `root_rank`'s model and optimizer
    variables, so that all start from the same state."""

    def __init__(self, root_rank=0, device=""):
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False

    def on_train_begin(self, logs=None):
        if self.broadcast_done:
            return
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        variables = list(self.model.variables)
        if optimizer is not None:
            variables += list(optimizer.variables)
        broadcast_variables(variables, self.root_rank)
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """At the end of each epoch, replaces every metric in `logs` by its average over the
    workers. Put it before callbacks that read the metrics (checkpoints, schedules)."""

    def __init__(self, device=""):
        super().__init__()

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        for key in sorted(logs):
            value = logs[key]
            if isinstance(value, (int, float)) or (hasattr(value, "dtype") and
                                                   getattr(value, "shape", ()) == ()):
                averaged = allreduce(tf.constant(float(value), tf.float64),
                                     name="metric." + key)
                logs[key] = float(averaged.numpy())


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the optimizer's learning rate to initial_lr * multiplier(epoch) from `start_epoch`
    to `end_epoch` (exclusive): `multiplier` is a number or a function of the epoch; with
    staircase=False the epoch is fractional and the rate changes every batch.

    momentum_correction is accepted for Horovod's signature but not applied: a Keras 3
    optimizer's momentum is a constant of its compiled step."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None, verbose=0):
        super().__init__()
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = 0
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)
        self.momentum_correction = momentum_correction

    def _in_range(self, epoch):
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _set(self, epoch):
        self.model.optimizer.learning_rate = self.initial_lr * self.multiplier(epoch)

    def on_train_begin(self, logs=None):
        if self.steps_per_epoch is None:
            self.steps_per_epoch = (self.params or {}).get("steps")
        if self.momentum_correction and getattr(self.model.optimizer, "momentum", 0):
            warnings.warn("sparsync: momentum_correction is not applied (Keras 3 compiles the "
                          "optimizer's momentum into its step)")

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch
        if self.staircase and self._in_range(epoch):
            self._set(epoch)

    def on_batch_begin(self, batch, logs=None):
        if self.staircase or not self._in_range(self.current_epoch):
            return
        if not self.steps_per_epoch:
            raise ValueError("LearningRateScheduleCallback with staircase=False needs "
                             "steps_per_epoch (model.fit did not say how many steps an epoch has)")
        self._set(self.current_epoch + float(batch) / self.steps_per_epoch)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Goyal et al.'s gradual warm-up: the learning rate grows from initial_lr / size() to
    initial_lr over the first `warmup_epochs`, a little every batch."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None,
                 verbose=0):
        def multiplier(epoch):
            n = _basics.size()
            return 1.0 / n * (epoch * (n - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch, verbose=verbose)
        self.warmup_epochs = warmup_epochs

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.warmup_epochs - 1:
            self.model.optimizer.learning_rate = self.initial_lr  # exactly, after the last batch
            if self.verbose and _basics.rank() == 0:
                print("\nEpoch %d: finished gradual learning rate warmup to %g."
                      % (epoch + 1, self.initial_lr))
