"""``import sparsync.keras as hvd``: the same module as sparsync.tensorflow.keras (Horovod has
both names)."""

from sparsync.tensorflow.keras import *  # noqa: F401,F403
from sparsync.tensorflow.keras import __all__  # noqa: F401
