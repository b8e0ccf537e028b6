"""The client library against a fake daemon that misbehaves (no sparsyncd needed)."""

import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import FAKE_DAEMON, sparsync_env

from sparsync import SparsyncError
from sparsync import _client as C


@pytest.fixture
def fake(short_tmp, client_library):
    procs = []

    def start(mode="normal", local_size=1, token="t0k"):
        path = str(short_tmp / ("f%d.sock" % len(procs)))
        env = sparsync_env({"SPARSYNC_SOCKET": path, "SPARSYNC_LOCAL_SIZE": str(local_size),
                            "SPARSYNC_JOB_TOKEN": token, "FAKE_DAEMON_MODE": mode})
        procs.append(subprocess.Popen([sys.executable, str(FAKE_DAEMON)], env=env,
                                      stdout=subprocess.DEVNULL))
        return path

    yield start
    for p in procs:
        p.terminate()
        p.wait()


def test_roundtrip_and_rounds(fake):
    path = fake()
    c = C.Client(path, "t0k", 0, 10)  # retries until the fake daemon is up
    assert c.world["size"] == 1 and c.world["rank"] == 0
    reg = c.register("x", C.OP_ALLREDUCE, C.FLOAT32, (2, 3))
    for i in range(3):
        reg.array(np.float32)[:] = i
        c.post(reg)
        c.wait(reg, 5)
        assert (reg.array(np.float32) == i).all()
    c.unregister(reg)
    with pytest.raises(SparsyncError, match="not registered"):
        c.post(reg)
    c.close()


def test_wrong_token_is_permission_error(fake):
    path = fake(token="right")
    with pytest.raises(SparsyncError, match="wrong job token") as e:
        C.Client(path, "wrong", 0, 10)
    assert e.value.status == 7


@pytest.mark.parametrize("mode,match", [("garbage-on-ready", "malformed"),
                                        ("close-on-ready", "closed the connection"),
                                        ("wrong-round-on-ready", "round")])
def test_misbehaving_daemon_is_unavailable(fake, mode, match):
    c = C.Client(fake(mode), "t0k", 0, 10)
    reg = c.register("x", C.OP_ALLREDUCE, C.FLOAT32, (4,))
    c.post(reg)
    start = time.monotonic()
    with pytest.raises(SparsyncError, match=match) as e:
        c.wait(reg, 10)
    assert e.value.status == 2 and time.monotonic() - start < 5
    with pytest.raises(SparsyncError) as again:  # sticky
        c.post(reg)
    assert again.value.status == 2
    c.close()


def test_wait_times_out_when_a_peer_never_posts(fake):
    c = C.Client(fake(local_size=2), "t0k", 0, 10)
    reg = c.register("x", C.OP_ALLREDUCE, C.FLOAT32, (4,))
    c.post(reg)
    assert c.try_wait(reg) is False
    start = time.monotonic()
    with pytest.raises(SparsyncError, match="timed out") as e:
        c.wait(reg, 1.5)
    assert e.value.status == 3 and 1.4 < time.monotonic() - start < 4
    c.close()


def test_connect_timeout_message(short_tmp, client_library):
    start = time.monotonic()
    with pytest.raises(SparsyncError) as e:
        C.Client(str(short_tmp / "none.sock"), "", 0, 1.0)
    assert 0.9 < time.monotonic() - start < 3
    msg = str(e.value)
    assert "SPARSYNC_SOCKET" in msg and "none.sock" in msg and "sparsyncrun" in msg
    assert e.value.status == 2


def test_sigpipe_does_not_kill_the_process(fake):
    # Python ignores SIGPIPE itself; a C program (or a TF op) does not: restore the default.
    path = fake("close-on-ready")
    code = """
import signal, sys, time
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
from sparsync import _client as C, SparsyncError
c = C.Client(sys.argv[1], "t0k", 0, 10)
reg = c.register("x", C.OP_ALLREDUCE, C.FLOAT32, (4,))
c.post(reg)
time.sleep(0.3)  # the daemon has closed its end by now
errors = 0
for _ in range(3):
    try:
        c.post(reg)
    except SparsyncError:
        errors += 1
c.close()
print("survived", errors)
"""
    out = subprocess.run([sys.executable, "-c", code, path], env=sparsync_env(),
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "survived 3" in out.stdout, (out.returncode, out.stderr)
