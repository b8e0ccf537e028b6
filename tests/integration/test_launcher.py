"""sparsyncrun: environment, output prefixes, failure propagation, clean-up."""

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from conftest import FAKE_DAEMON, daemon_path, processes_with_env, sparsync_env


@pytest.fixture
def launcher(short_tmp, client_library):
    """Runs sparsyncrun with TMPDIR in a private directory; real daemon if built, else fake."""
    tmpdir = short_tmp / "t"
    tmpdir.mkdir()
    real = daemon_path()
    if real is None:
        wrapper = short_tmp / "fake-sparsyncd"
        wrapper.write_text("#!/bin/sh\nexec %s %s \"$@\"\n" % (sys.executable, FAKE_DAEMON))
        wrapper.chmod(0o755)

    class Launcher:
        multi_node = real is not None
        tag = uuid.uuid4().hex
        tmpdir = short_tmp / "t"

        def env(self, extra=None):
            env = sparsync_env({"TMPDIR": str(tmpdir), "SPARSYNC_TEST_TAG": self.tag})
            if real is None:
                env["SPARSYNC_DAEMON"] = str(wrapper)
            env.update(extra or {})
            return env

        def popen(self, args, extra=None):
            return subprocess.Popen([sys.executable, "-m", "sparsync.run"] + args,
                                    env=self.env(extra), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True)

        def run(self, args, timeout=90, extra=None):
            p = self.popen(args, extra)
            out, _ = p.communicate(timeout=timeout)
            return p.returncode, out

        def assert_nothing_left(self):
            deadline = time.monotonic() + 5
            while processes_with_env(self.tag) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert processes_with_env(self.tag) == [], "processes left behind"
            assert os.listdir(tmpdir) == [], "files left in TMPDIR: %s" % os.listdir(tmpdir)

    return Launcher()


def test_help_describes_the_options(launcher):
    rc, out = launcher.run(["--help"])
    assert rc == 0
    for word in ("-np", "--nodes", "--timeout-s", "SPARSYNC_SOCKET", "SPARSYNC_RANK", "[d<i>]"):
        assert word in out


def test_uneven_split_is_refused(launcher):
    rc, out = launcher.run(["-np", "3", "--nodes", "2", "true"])
    assert rc == 2 and "multiple" in out, out


def test_workers_get_their_ranks_and_prefixed_output(launcher):
    nodes = 2 if launcher.multi_node else 1
    code = ("import os, sparsync.torch as hvd\nhvd.init()\n"
            "print('hello', hvd.rank(), hvd.size(), hvd.local_rank(), os.environ['SPARSYNC_RANK'])"
            "\nhvd.shutdown()\n")
    rc, out = launcher.run(["-np", "4", "--nodes", str(nodes), "python", "-c", code])
    assert rc == 0, out
    local = 4 // nodes
    for r in range(4):
        assert "[%d] hello %d 4 %d %d" % (r, r, r % local, r) in out, out
    assert "[d0] " in out, out
    launcher.assert_nothing_left()


def test_failing_worker_stops_the_job(launcher):
    code = ("import os, sys, time\n"
            "if os.environ['SPARSYNC_RANK'] == '1':\n    time.sleep(0.5); sys.exit(3)\n"
            "time.sleep(600)\n")
    start = time.monotonic()
    rc, out = launcher.run(["-np", "2", "--nodes", "1", "python", "-c", code])
    assert rc == 3, out
    assert "worker rank 1" in out and "failed first: exit status 3" in out, out
    assert time.monotonic() - start < 30
    launcher.assert_nothing_left()


def test_daemon_that_dies_at_start_is_reported(launcher):
    rc, out = launcher.run(["-np", "1", "true"], extra={"SPARSYNC_DAEMON": "/bin/false"})
    assert rc != 0 and "daemon of node 0" in out and "during start-up" in out, out
    launcher.assert_nothing_left()


def test_an_interrupt_while_a_child_starts_is_raised_once_it_is_recorded():
    """The launchers start and record each process inside GATE.holding(): a Ctrl-C there used
    to leave the process just started running, unrecorded (_signal_gate.py)."""
    from sparsync._signal_gate import SignalGate

    gate, recorded = SignalGate(), []
    with pytest.raises(KeyboardInterrupt):
        with gate.holding():
            gate.interrupt(KeyboardInterrupt())  # what the handler does mid-start
            recorded.append("child")
    assert recorded == ["child"]
    with pytest.raises(KeyboardInterrupt):  # outside a held block: at once
        gate.interrupt(KeyboardInterrupt())
    with gate.holding():  # nothing pending is left over from before
        pass


_SLEEPER = "import time\nprint('ready', flush=True)\ntime.sleep(600)\n"


def _start_and_wait_ready(launcher, args=("-np", "2", "--nodes", "1", "python", "-c", _SLEEPER)):
    """Starts sparsyncrun with `args` and reads its output up to a worker's 'ready'."""
    p = launcher.popen(list(args))
    seen = []
    for line in p.stdout:
        seen.append(line)
        if "ready" in line:
            break
    assert any("ready" in line for line in seen), "".join(seen)
    return p


def test_ctrl_c_leaves_nothing_behind(launcher):
    p = _start_and_wait_ready(launcher)
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=30)
    assert p.returncode != 0
    assert "SIGINT" in out
    launcher.assert_nothing_left()


def test_ctrl_c_also_stops_what_a_worker_left_that_ignores_sigterm(launcher):
    """A worker's helper that ignores SIGTERM outlives the worker; the launcher's SIGKILL of the
    worker's process group must still reach it once the worker has ended."""
    code = ("import subprocess, time\n"
            "subprocess.Popen(['sh', '-c', 'trap \"\" TERM; sleep 600'])\n"
            "time.sleep(0.5)\nprint('ready', flush=True)\ntime.sleep(600)\n")
    p = _start_and_wait_ready(launcher, ("-np", "1", "python", "-c", code))
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=30)
    assert p.returncode != 0
    launcher.assert_nothing_left()


# Issue 16, D12: the exit status after a stop signal is 128 + its number, as shells report it.
@pytest.mark.parametrize("sig,code", [(signal.SIGHUP, 129), (signal.SIGTERM, 143),
                                      (signal.SIGINT, 130)])
def test_a_stop_signal_gives_128_plus_its_number(launcher, sig, code):
    p = _start_and_wait_ready(launcher)
    p.send_signal(sig)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == code, out
    launcher.assert_nothing_left()


# Issue 16, D8: a launcher killed with SIGKILL cannot clean up; its reaper stops what it started
# and removes its temporary directory.
def test_a_launcher_killed_with_sigkill_leaves_nothing_behind(launcher):
    p = _start_and_wait_ready(launcher)
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    out = p.stdout.read()
    deadline = time.monotonic() + 15  # the daemons get the launcher's 5 s grace
    while time.monotonic() < deadline:
        if not processes_with_env(launcher.tag) and not os.listdir(launcher.tmpdir):
            break
        time.sleep(0.2)
    launcher.assert_nothing_left()
    assert out is not None
