"""Multi-process harness: real sparsyncd daemons on loopback and worker processes.

`Job` starts the daemons itself (the same environment sparsyncrun gives them) so that a test can
watch every worker's exit status and output, including after another worker was killed; the
launcher is tested through `sparsyncrun` in test_launcher.py.
"""

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent / "workers"
FAKE_DAEMON = Path(__file__).resolve().parent / "fake_daemon.py"
sys.path.insert(0, str(REPO / "shims" / "python"))

from sparsync._paths import find_client_library, find_daemon  # noqa: E402


def daemon_path():
    path = find_daemon()
    return path if path and os.access(path, os.X_OK) else None


@pytest.fixture(scope="session")
def daemon():
    path = daemon_path()
    if path is None:
        pytest.skip("sparsyncd not built (looked at $SPARSYNC_DAEMON and build/daemon/sparsyncd): "
                    "run cmake -S . -B build -G Ninja && cmake --build build")
    if find_client_library() is None:
        pytest.skip("libsparsync_client.so not built")
    return path


@pytest.fixture(scope="session")
def client_library():
    if find_client_library() is None:
        pytest.skip("libsparsync_client.so not built (build/shims/client or build-client)")
    return find_client_library()


@pytest.fixture
def short_tmp():
    # Unix socket paths are limited to 107 bytes: keep the directory short.
    d = tempfile.mkdtemp(prefix="sst-")
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sparsync_env(extra=None):
    """The caller's environment without SPARSYNC_* leftovers, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARSYNC_")}
    for k in ("SPARSYNC_DAEMON", "SPARSYNC_CLIENT_LIB"):
        if k in os.environ:
            env[k] = os.environ[k]
    env["PYTHONPATH"] = str(REPO / "shims" / "python")
    env["PYTHONUNBUFFERED"] = "1"
    # Every group of at least SPARSYNC_MIN_COMPRESS_BYTES is compressed: with the default (auto)
    # the planner sends a group dense when its timing predicts that faster, so that two runs
    # (or a run and its reference) need not compress the same groups. Tests of that choice pass
    # SPARSYNC_COMPRESS=auto.
    env["SPARSYNC_COMPRESS"] = "always"
    env.update(extra or {})
    return env


def proc_alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


def processes_with_env(tag):
    """PIDs of live processes whose environment holds SPARSYNC_TEST_TAG=<tag>."""
    needle = ("SPARSYNC_TEST_TAG=%s" % tag).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as f:
                if needle in f.read().split(b"\0") and proc_alive(int(entry)):
                    found.append(int(entry))
        except OSError:
            pass
    return found


class Job:
    def __init__(self, daemon, nodes, local_size, tmp, extra_env=None, node_env=None):
        """`node_env(i)`: variables for node i's daemon alone (e.g. its metrics port)."""
        self.daemon, self.nodes, self.local_size = daemon, nodes, local_size
        self.node_env = node_env or (lambda i: {})
        self.size = nodes * local_size
        self.tmp = Path(tmp)
        self.token = secrets.token_hex(8)
        self.extra_env = dict(extra_env or {})
        self.daemons, self.workers = [], []
        self.outdir = self.tmp / "out"
        self.outdir.mkdir(exist_ok=True)

    def socket(self, node):
        return str(self.tmp / ("n%d.sock" % node))

    def start(self, timeout_s=60):
        port = free_port()
        for i in range(self.nodes):
            # The suites check the exact dense path unless a test names a compressor.
            env = sparsync_env({"SPARSYNC_COMPRESSOR": "none", **self.extra_env})
            env.update({"SPARSYNC_NODE_RANK": str(i), "SPARSYNC_NUM_NODES": str(self.nodes),
                        "SPARSYNC_COORDINATOR": "127.0.0.1:%d" % port,
                        "SPARSYNC_LISTEN": "127.0.0.1", "SPARSYNC_SOCKET": self.socket(i),
                        "SPARSYNC_LOCAL_SIZE": str(self.local_size),
                        "SPARSYNC_JOB_TOKEN": self.token})
            env.update(self.node_env(i))
            log = open(self.tmp / ("d%d.log" % i), "wb")
            self.daemons.append(subprocess.Popen([self.daemon], env=env, stdout=log,
                                                 stderr=subprocess.STDOUT,
                                                 start_new_session=True))
            log.close()
        deadline = time.monotonic() + timeout_s
        while not all(os.path.exists(self.socket(i)) for i in range(self.nodes)):
            for i, d in enumerate(self.daemons):
                if d.poll() is not None:
                    raise AssertionError("daemon %d exited with %s during start-up\n%s"
                                         % (i, d.returncode, self.logs()))
            if time.monotonic() > deadline:
                raise AssertionError("daemons did not create their sockets within %d s\n%s"
                                     % (timeout_s, self.logs()))
            time.sleep(0.05)
        return self

    def worker_env(self, r, extra=None):
        env = sparsync_env(self.extra_env)
        env.update({"SPARSYNC_SOCKET": self.socket(r // self.local_size),
                    "SPARSYNC_JOB_TOKEN": self.token,
                    "SPARSYNC_LOCAL_RANK": str(r % self.local_size), "SPARSYNC_RANK": str(r),
                    "SPARSYNC_SIZE": str(self.size), "OUT_DIR": str(self.outdir)})
        env.update(extra or {})
        return env

    def run_workers(self, script, args=(), timeout_s=120, extra=None):
        """Runs one worker per rank to completion; returns their exit statuses."""
        self.workers = []
        for r in range(self.size):
            log = open(self.tmp / ("w%d.log" % r), "wb")
            self.workers.append(subprocess.Popen(
                [sys.executable, str(WORKERS / script)] + list(args),
                env=self.worker_env(r, extra), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True))
            log.close()
        deadline = time.monotonic() + timeout_s
        rcs = []
        for w in self.workers:
            try:
                rcs.append(w.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                rcs.append(None)
        return rcs

    def worker_log(self, r):
        return (self.tmp / ("w%d.log" % r)).read_text(errors="replace")

    def logs(self):
        out = []
        for f in sorted(self.tmp.glob("*.log")):
            out.append("----- %s -----\n%s" % (f.name, f.read_text(errors="replace")[-4000:]))
        return "\n".join(out)

    def stop(self):
        """SIGTERM every daemon; returns their exit statuses (None: had to be killed)."""
        for w in self.workers:
            if w.poll() is None:
                os.killpg(w.pid, signal.SIGKILL)
                w.wait()
        for d in self.daemons:
            if d.poll() is None:
                d.send_signal(signal.SIGTERM)
        rcs = []
        for d in self.daemons:
            try:
                rcs.append(d.wait(timeout=10))
            except subprocess.TimeoutExpired:
                os.killpg(d.pid, signal.SIGKILL)
                d.wait()
                rcs.append(None)
        return rcs

    def assert_clean_after_stop(self, rcs, killed=()):
        """Every daemon ended; those not killed with SIGKILL removed their sockets (a killed
        one cannot: the next daemon on that path removes the dead socket)."""
        assert None not in rcs, "a daemon ignored SIGTERM for 10 s\n" + self.logs()
        for d in self.daemons:
            assert not proc_alive(d.pid)
        left = [i for i in range(self.nodes)
                if i not in killed and os.path.exists(self.socket(i))]
        assert not left, "daemons of nodes %s left their socket files behind" % left


@pytest.fixture
def job_factory(daemon, short_tmp):
    jobs = []

    def make(nodes, local_size, extra_env=None):
        sub = short_tmp / ("j%d" % len(jobs))
        sub.mkdir(mode=0o700)  # the daemons refuse a socket directory others may enter
        job = Job(daemon, nodes, local_size, sub, extra_env)
        jobs.append(job)
        return job.start()

    yield make
    for job in jobs:
        job.stop()
