"""hvd.elastic for sparsync.torch: not supported; every entry point says so.

Horovod's elastic mode re-forms the job when workers come or go (hosts discovered by a script,
state committed and restored). sparsyncd's job is fixed at start: SPARSYNC_NUM_NODES daemons with
SPARSYNC_LOCAL_SIZE workers each; a worker or daemon that dies fails the job with an error naming
it (docs/operations.md), and a new job starts from a checkpoint.
"""

from sparsync._errors import SparsyncError

_MESSAGE = ("hvd.elastic is not supported by sparsync: a job has a fixed set of workers "
            "(SPARSYNC_NUM_NODES x SPARSYNC_LOCAL_SIZE) and fails with a clear error when one "
            "dies; save checkpoints and restart the job (sparsyncrun) instead")


class ElasticNotSupportedError(SparsyncError, NotImplementedError):
    """Raised by every hvd.elastic entry point."""


def run(func):
    """Horovod's @hvd.elastic.run decorator: refused at decoration time, not at the first call,
    so that a script fails before it trains."""
    raise ElasticNotSupportedError(_MESSAGE)


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's elastic interrupt; never raised here (the set of hosts never changes)."""

    def __init__(self, skip_sync=False):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


class _Refused:
    def __init__(self, *args, **kwargs):
        raise ElasticNotSupportedError(_MESSAGE)


class State(_Refused):
    pass


class ObjectState(_Refused):
    pass


class TorchState(_Refused):
    pass


class ElasticSampler(_Refused):
    pass
