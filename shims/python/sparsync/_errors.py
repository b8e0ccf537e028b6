"""The exception every sparsync failure surfaces as."""


class SparsyncError(RuntimeError):
    """A sparsync operation failed; the message is the daemon's (or the client library's).

    ``status`` is the sparsync_status code of proto/intake/wire.h (``None`` when the failure
    happened before a call reached the client library).
    """

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


class HorovodInternalError(SparsyncError):
    """A collective failed (Horovod's name, raised where Horovod raises it: synchronize() and the
    operations that wait, DistributedOptimizer.step()); the message is the daemon's."""
