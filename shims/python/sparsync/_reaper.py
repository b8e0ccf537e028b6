"""sparsyncrun's reaper: cleans up after a launcher that was killed with SIGKILL (issue 16, D8).

The launcher starts this script first, in a session of its own, and writes to its stdin one line
"pgid N" for each process group it starts (daemons and workers), then "done" when it has stopped
them all itself. When stdin ends without "done" the launcher died without cleaning up (nothing
else ends a pipe's writer so): the reaper stops every process group it was told of (SIGTERM and
SIGCONT, SIGKILL after a grace period) and removes the launcher's temporary directory.

Run as a file, not as a module, so that it needs nothing but the standard library:
    python3 _reaper.py TMPDIR
"""

import os
import shutil
import signal
import sys
import time

GRACE_S = 5.0


def _alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _signal_all(groups, sig):
    for pgid in groups:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop_groups(groups, grace_s=GRACE_S):
    """SIGTERM (and SIGCONT, for a stopped one), then SIGKILL what is left after grace_s."""
    _signal_all(groups, signal.SIGTERM)
    _signal_all(groups, signal.SIGCONT)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(g) for g in groups):
        time.sleep(0.05)
    left = [g for g in groups if _alive(g)]
    _signal_all(left, signal.SIGKILL)
    return left


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: _reaper.py TMPDIR\n")
        return 2
    tmpdir = argv[1]
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)  # only the launcher's end of the pipe ends this
    groups, clean = [], False
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["pgid"] and len(words) == 2 and words[1].isdigit():
            groups.append(int(words[1]))
        elif words == ["done"]:
            clean = True
    if clean:
        return 0
    killed = stop_groups(groups)
    shutil.rmtree(tmpdir, ignore_errors=True)
    sys.stderr.write("sparsyncrun: the launcher died without cleaning up: stopped its %d process "
                     "group(s)%s and removed %s\n"
                     % (len(groups), " (%d with SIGKILL)" % len(killed) if killed else "", tmpdir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
