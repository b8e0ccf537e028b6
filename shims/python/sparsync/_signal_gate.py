"""Holding back sparsyncrun's interrupt while a child process is started and recorded.

The launchers turn SIGINT, SIGTERM and SIGHUP into an exception raised in the main thread,
wherever that thread is. Raised between starting a process and recording it (in the launcher's
list and with the reaper), the exception left that process running with nothing to stop it: a
Ctrl-C just as the workers started left the last worker behind, in 4 of 12 trials of
tests/integration/test_launcher.py's Ctrl-C test on a 2-core machine. Inside `holding()` the
signal handler records the interrupt instead, and it is raised when the block ends, once the
process is recorded and will be stopped with the others.
"""

import contextlib


class SignalGate:
    def __init__(self):
        self._depth = 0
        self._pending = None

    def interrupt(self, exc):
        """Called from the signal handler: raises `exc` now, or when the held block ends."""
        if self._depth:
            if self._pending is None:
                self._pending = exc
            return
        raise exc

    @contextlib.contextmanager
    def holding(self):
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0 and self._pending is not None:
                exc, self._pending = self._pending, None
                raise exc


GATE = SignalGate()
