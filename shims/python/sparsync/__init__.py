"""sparsync: gradient reduction through a per-node daemon, with the Horovod API.

Use ``import sparsync.torch as hvd`` in training scripts and ``sparsyncrun`` to launch them;
``sparsync.run(func, np=4)`` launches a function, as ``horovod.run`` does.
"""

from sparsync._errors import SparsyncError


def __getattr__(name):
    # sparsync.run: the launcher's module, callable as sparsync.run(func, np=...). Imported on
    # first use, not here, so that `python -m sparsync.run` runs it once, as __main__ only.
    if name == "run":
        import importlib

        return importlib.import_module("sparsync.run")
    raise AttributeError("module 'sparsync' has no attribute %r" % name)

__all__ = ["SparsyncError", "run"]
__version__ = "0.1.0"
