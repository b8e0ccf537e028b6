"""Hardening against other local users and misbehaving clients (issue 16), with real daemons.

Multi-user tests create a throwaway user (as root) and remove it afterwards; without root they
skip with the reason.
"""

import os
import pwd
import resource
import secrets
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest

from conftest import REPO, free_port, sparsync_env

sys.path.insert(0, str(REPO / "shims" / "python"))
from sparsync import _client as C  # noqa: E402
from sparsync import _wire as W  # noqa: E402
from sparsync._errors import SparsyncError  # noqa: E402


_started = []  # every Daemon of the current test, stopped after it whatever its outcome


@pytest.fixture(autouse=True)
def _no_daemon_outlives_its_test():
    yield
    while _started:
        proc = _started.pop().proc
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=15)


class Daemon:
    """One single-node sparsyncd on a socket in its own private directory."""

    def __init__(self, daemon, tmp, extra=None, preexec_fn=None):
        self.dir = tmp / ("d%s" % secrets.token_hex(3))
        self.dir.mkdir(mode=0o700)
        self.socket = str(self.dir / "d.sock")
        self.log_path = self.dir / "d.log"
        env = sparsync_env({"SPARSYNC_SOCKET": self.socket, "SPARSYNC_COMPRESSOR": "none",
                            "SPARSYNC_COORDINATOR": "127.0.0.1:%d" % free_port(),
                            "SPARSYNC_CALIBRATE": "0", **(extra or {})})
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([daemon], env=env, stdout=log, stderr=subprocess.STDOUT,
                                         preexec_fn=preexec_fn, start_new_session=True)
        _started.append(self)

    def wait_ready(self, timeout_s=30):
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(self.socket):
            assert self.proc.poll() is None, "the daemon ended:\n" + self.log()
            assert time.monotonic() < deadline, "no socket:\n" + self.log()
            time.sleep(0.05)
        return self

    def log(self):
        return self.log_path.read_text(errors="replace")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=15)

    def cpu_s(self):
        with open("/proc/%d/stat" % self.proc.pid) as f:
            fields = f.read().rsplit(") ", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_daemon(daemon, args, env):
    return subprocess.run([daemon] + args, env=sparsync_env(env), capture_output=True, text=True,
                          timeout=30)


@pytest.fixture
def throwaway_user():
    if os.geteuid() != 0:
        pytest.skip("needs root to create a throwaway user")
    if shutil.which("useradd") is None:
        pytest.skip("useradd is not installed")
    name = "spst%s" % secrets.token_hex(3)
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                   check=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], check=False)
        subprocess.run(["userdel", name], check=False)


# D1: a socket directory another user made is refused, naming it and its owner.
def test_a_socket_directory_of_another_user_is_refused(daemon, short_tmp, throwaway_user):
    theirs = short_tmp / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, throwaway_user.pw_uid, throwaway_user.pw_gid)
    r = run_daemon(daemon, [], {"SPARSYNC_SOCKET": str(theirs / "d.sock"),
                                "SPARSYNC_COORDINATOR": "127.0.0.1:%d" % free_port()})
    assert r.returncode == 1, r.stdout + r.stderr
    text = r.stdout + r.stderr
    assert str(theirs) in text and throwaway_user.pw_name in text, text
    assert not (theirs / "d.sock").exists()


LISTENER = r"""
import os, socket, sys
path, report = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.bind(path)
os.chmod(path, 0o777)
s.listen(1)
open(report + ".ready", "w").close()
s.settimeout(20)
conn, _ = s.accept()
conn.settimeout(3)
try:
    data = conn.recv(4096)
except socket.timeout:
    data = b""
with open(report, "w") as f:
    f.write(str(len(data)))
"""


# D1: the worker checks who listens before it sends the token; another user's listener in the
# socket's place gets nothing.
def test_a_listener_of_another_user_never_gets_the_token(client_library, short_tmp,
                                                         throwaway_user):
    os.chmod(short_tmp, 0o711)  # the other user may pass through to the directory below
    trap = short_tmp / "trap"
    trap.mkdir(mode=0o777)
    os.chmod(trap, 0o777)
    path, report = str(trap / "d.sock"), str(trap / "report")
    listener = subprocess.Popen(["runuser", "-u", throwaway_user.pw_name, "--", sys.executable,
                                 "-c", LISTENER, path, report])
    deadline = time.monotonic() + 20
    while not os.path.exists(report + ".ready"):
        assert time.monotonic() < deadline and listener.poll() is None, "listener did not start"
        time.sleep(0.05)
    with pytest.raises(SparsyncError) as e:
        C.Client(path, "the-secret-token", 0, 2.0)
    assert e.value.status == W.ERR_PERMISSION, str(e.value)
    assert "uid %d" % throwaway_user.pw_uid in str(e.value), str(e.value)
    listener.wait(timeout=30)
    with open(report) as f:
        assert f.read() == "0", "the listener received bytes"


# D2: a daemon started by hand without a token generates one and leaves it for its workers.
def test_a_daemon_without_a_token_generates_one(daemon, short_tmp):
    d = Daemon(daemon, short_tmp).wait_ready()
    token_file = d.socket + ".token"
    st = os.stat(token_file)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    with open(token_file) as f:
        token = f.read()
    assert len(token) == 32 and all(c in "0123456789abcdef" for c in token), token
    assert token not in d.log(), "the token must not be logged"
    c = C.Client(d.socket, None, 0, 10.0)  # no token given: the file is read
    c.close()
    with pytest.raises(SparsyncError) as e:
        C.Client(d.socket, "", 0, 10.0)  # an empty token is not the job's
    assert e.value.status == W.ERR_PERMISSION
    assert d.stop() == 0
    assert not os.path.exists(token_file) and not os.path.exists(d.socket)


def test_other_nodes_without_a_token_refuse_to_start(daemon):
    r = run_daemon(daemon, ["--num-nodes", "2", "--node-rank", "1"], {})
    assert r.returncode == 2, r.stdout + r.stderr
    assert "SPARSYNC_JOB_TOKEN_FILE" in r.stderr, r.stderr


# D3: a token on the command line is visible to every user in ps; the flag is refused.
def test_the_token_flag_is_refused(daemon):
    r = run_daemon(daemon, ["--job-token", "s3cret"], {})
    assert r.returncode == 2
    assert "ps" in r.stderr and "SPARSYNC_JOB_TOKEN" in r.stderr, r.stderr
    assert "s3cret" not in r.stdout + r.stderr


# D7: a path that is not a socket is never removed.
def test_a_socket_path_that_is_a_file_is_left_alone(daemon, short_tmp):
    precious = short_tmp / "precious.txt"
    precious.write_text("keep me")
    r = run_daemon(daemon, [], {"SPARSYNC_SOCKET": str(precious),
                                "SPARSYNC_COORDINATOR": "127.0.0.1:%d" % free_port()})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "not a socket" in r.stdout + r.stderr
    assert precious.read_text() == "keep me"


# D10: what the workers may register is bounded; a refused registration leaves the daemon
# serving.
def test_huge_registrations_are_refused_and_the_daemon_goes_on(daemon, short_tmp):
    d = Daemon(daemon, short_tmp, {"SPARSYNC_JOB_TOKEN": "t",
                                   "SPARSYNC_MAX_REGISTERED_BYTES": "1GiB"}).wait_ready()
    c = C.Client(d.socket, "t", 0, 10.0)
    for i in range(200):
        with pytest.raises(SparsyncError) as e:
            c.register("huge%d" % i, C.OP_ALLREDUCE, C.FLOAT32, (1 << 38,), C.REDUCE_SUM)
        assert "SPARSYNC_MAX_REGISTERED_BYTES" in str(e.value), str(e.value)
    reg = c.register("small", C.OP_ALLREDUCE, C.FLOAT32, (4,), C.REDUCE_SUM)
    reg.array(__import__("numpy").float32)[:] = 2.0
    c.post(reg)
    c.wait(reg, 10.0)
    c.close()
    assert d.stop() == 0


def _hello(token):
    return W.HELLO.pack(0, os.getpid(), len(token), 0, token)


# D5: at the open-file limit new connections are answered with the reason, the intake loop
# idles, and the log stays small; connections that never shake hands are closed after 10 s.
def test_at_the_open_file_limit_workers_hear_why(daemon, short_tmp):
    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    d = Daemon(daemon, short_tmp, {"SPARSYNC_JOB_TOKEN": "t"}, preexec_fn=low_limit).wait_ready()
    # All at once: connections that stay silent are closed after 10 s, which frees descriptors,
    # so connecting slowly would never reach the limit.
    conns = []
    for _ in range(80):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(d.socket)
        conns.append(s)
    replies, held = [], list(conns)
    deadline = time.monotonic() + 3.0
    while held and time.monotonic() < deadline:
        readable, _, _ = select.select(held, [], [], 0.2)
        for s in readable:
            replies.append(s.recv(4096))
            held.remove(s)  # a refused one; the others each hold one of the daemon's descriptors
            s.close()
    assert replies, "no connection was refused at a limit of 64 descriptors"
    status, *_, message = W.HELLO_REPLY.unpack(replies[0])
    message = message.split(b"\0")[0].decode()
    assert status == W.ERR_UNAVAILABLE
    assert "no free file descriptor" in message and "ulimit -n" in message, message
    cpu0 = d.cpu_s()
    time.sleep(2.0)
    assert d.cpu_s() - cpu0 < 0.3, "the intake loop spins at the limit"
    assert d.log_path.stat().st_size < 50000, d.log()[-2000:]
    time.sleep(9.0)  # the silent connections are closed, and workers are served again
    c = C.Client(d.socket, "t", 0, 10.0)
    c.close()
    for s in held:
        s.close()
    assert d.stop() == 0


# D11: a flood of connections refused before their handshake leaves a few log lines.
def test_refused_connections_are_logged_sparingly(daemon, short_tmp):
    d = Daemon(daemon, short_tmp, {"SPARSYNC_JOB_TOKEN": "t"}).wait_ready()
    for _ in range(2000):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(d.socket)
        s.send(b"garbage")
        s.settimeout(5)
        s.recv(4096)  # closed by the daemon
        s.close()
    assert d.stop() == 0
    lines = [l for l in d.log().splitlines() if "before its handshake" in l]
    assert 1 <= len(lines) <= 10, "%d lines" % len(lines)


# D6: a worker that stops reading holds up neither the intake nor other workers.
def test_a_worker_that_stops_reading_holds_up_nobody(daemon, short_tmp):
    d = Daemon(daemon, short_tmp, {"SPARSYNC_JOB_TOKEN": "t", "SPARSYNC_LOCAL_SIZE": "2"})
    d.wait_ready()
    deaf = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    deaf.connect(d.socket)
    deaf.send(_hello(b"t"))
    for i in range(3000):  # each reply carries a region's descriptor; nobody reads them
        name = b"t%d" % i
        try:
            deaf.send(W.REGISTER.pack(i, C.OP_ALLREDUCE, C.FLOAT32, C.REDUCE_SUM, 1, 0, len(name),
                                      0, 0, 0.0, *([4] + [0] * 7), name, 0, 0, 0, b"", b"",
                                      *([0] * W.SET_WORDS), 0, 0, 0))
        except (BrokenPipeError, ConnectionResetError):
            break  # the daemon gave up on it (64 descriptors waited for it): what D6 wants
    # The other worker is answered at once: served, or (once the daemon gave up on the deaf
    # one, which fails the job as any worker that leaves mid-job does) told why.
    start = time.monotonic()
    try:
        c = C.Client(d.socket, "t", 1, 10.0)
        assert c.register("other", C.OP_ALLREDUCE, C.FLOAT32, (4,), C.REDUCE_SUM) is not None
        c.close()
    except SparsyncError as e:
        assert "does not read" in str(e), e
    assert time.monotonic() - start < 2.0
    deaf.close()
    assert d.stop() == 0
    assert "does not read" in d.log() or "has not read" in d.log(), d.log()[-3000:]


def _make_authority(where, name):
    where.mkdir(mode=0o700)
    (where / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for argv in (["req", "-x509"] + ec + ["-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
                                          "-subj", "/CN=" + name],
                 ["req"] + ec + ["-keyout", "node.key", "-out", "node.csr", "-subj", "/CN=node"],
                 ["x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                  "-CAcreateserial", "-out", "node.pem", "-days", "1", "-extfile", "ext.cnf"]):
        subprocess.run(["openssl"] + argv, cwd=where, check=True, capture_output=True)
    os.chmod(where / "node.key", 0o600)
    return {"SPARSYNC_TLS_CERT": str(where / "node.pem"), "SPARSYNC_TLS_KEY": str(where / "node.key"),
            "SPARSYNC_TLS_CA": str(where / "ca.pem")}


# D2: the coordinator's channel with mutual TLS: the job runs; a node of another authority is
# refused.
def test_a_job_over_mutual_tls(job_factory, short_tmp):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: no throwaway authority")
    tls = _make_authority(short_tmp / "ca", "sparsync-test-ca")
    job = job_factory(2, 1, {**tls, "SPARSYNC_TIMEOUT_S": "20", "SPARSYNC_CALIBRATE": "0"})
    assert "mutual TLS" in (job.tmp / "d0.log").read_text()
    rcs = job.run_workers(str(REPO / "tests" / "faults" / "worker.py"), timeout_s=60,
                          extra={"FAULT_STEPS": "3"})
    assert rcs == [0, 0], job.logs()
    job.assert_clean_after_stop(job.stop())


def test_a_node_of_another_authority_is_refused(daemon, short_tmp):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: no throwaway authority")
    ours = _make_authority(short_tmp / "ours", "sparsync-test-ca")
    theirs = _make_authority(short_tmp / "theirs", "someone-else")
    port = free_port()
    common = {"SPARSYNC_NUM_NODES": "2", "SPARSYNC_JOB_TOKEN": "t", "SPARSYNC_TIMEOUT_S": "4",
              "SPARSYNC_COORDINATOR": "127.0.0.1:%d" % port, "SPARSYNC_CALIBRATE": "0"}
    sock0 = short_tmp / "n0"
    sock0.mkdir(mode=0o700)
    node0 = subprocess.Popen([daemon], env=sparsync_env({**common, **ours,
                                                         "SPARSYNC_SOCKET": str(sock0 / "s")}),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sock1 = short_tmp / "n1"
    sock1.mkdir(mode=0o700)
    r = subprocess.run([daemon], env=sparsync_env({**common, **theirs, "SPARSYNC_NODE_RANK": "1",
                                                   "SPARSYNC_SOCKET": str(sock1 / "s")}),
                       capture_output=True, text=True, timeout=60)
    node0.send_signal(signal.SIGTERM)
    node0.communicate(timeout=30)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "could not join the coordinator" in r.stdout + r.stderr, r.stdout + r.stderr
