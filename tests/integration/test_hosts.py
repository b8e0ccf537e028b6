"""sparsyncrun on several hosts: host lists in Horovod's and mpirun's formats, and real jobs over
OpenSSH into network namespaces (hostnet.py), each running Debian's sshd with key
authentication; the launcher runs in a namespace of its own. Checked: ranks and environment on
every host, the token never on a command line, an unreachable host failing within seconds naming
it, the first failure stopping every host, and Ctrl-C or SIGTERM leaving nothing anywhere.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

from conftest import REPO, processes_with_env, sparsync_env
from sparsync import _hosts

HOSTS = 3  # namespaces 0, 1: hosts with sshd; 2: the launcher's
LAUNCHER_NS = 2


# ---- host lists (no network) ----

def test_host_lists_in_horovods_and_open_mpis_forms():
    assert _hosts.parse_host_list("a:2,b:2") == [("a", 2), ("b", 2)]
    assert _hosts.parse_host_list("a,a,b") == [("a", 2), ("b", 1)]
    assert _hosts.parse_host_list("[fe80::1]:4,10.0.0.2") == [("fe80::1", 4), ("10.0.0.2", 1)]
    for bad in ("a:0", "a:x", "a,,b", ""):
        with pytest.raises(_hosts.HostError):
            _hosts.parse_host_list(bad)


def test_hostfiles_in_horovods_mpirun_and_mpich_forms():
    text = ("# the cluster\n"
            "node1 slots=4\n"
            "node2 slots=2 max_slots=8   # Open MPI\n"
            "node3:3\n"
            "\n"
            "node4\n")
    assert _hosts.parse_hostfile(text) == [("node1", 4), ("node2", 2), ("node3", 3),
                                           ("node4", 1)]
    with pytest.raises(_hosts.HostError, match="line 1"):
        _hosts.parse_hostfile("node1 cpus=4\n", "hf")
    with pytest.raises(_hosts.HostError, match="names no host"):
        _hosts.parse_hostfile("# nothing\n")


def test_ranks_fill_hosts_in_order_and_must_split_evenly():
    assert _hosts.assign([("a", 2), ("b", 2), ("c", 2)], 4) == [("a", 0, 2), ("b", 2, 2)]
    assert _hosts.assign([("a", 1), ("b", 1)], 2) == [("a", 0, 1), ("b", 1, 1)]
    with pytest.raises(_hosts.HostError, match="2, 1"):
        _hosts.assign([("a", 2), ("b", 2)], 3)
    with pytest.raises(_hosts.HostError, match="4 slots"):
        _hosts.assign([("a", 2), ("b", 2)], 5)


def test_the_job_environment_is_sparsync_python_and_what_x_names():
    environ = {"SPARSYNC_COMPRESSOR": "none", "PYTHONPATH": "/p", "VIRTUAL_ENV": "/v",
               "HOME": "/root", "OMP_NUM_THREADS": "2", "SECRET": "s"}
    env = _hosts.job_environment(environ, ["OMP_NUM_THREADS", "EXTRA=1", "UNSET"])
    assert env == {"SPARSYNC_COMPRESSOR": "none", "PYTHONPATH": "/p", "VIRTUAL_ENV": "/v",
                   "OMP_NUM_THREADS": "2", "EXTRA": "1"}


def run_launcher(args, extra_env=None, timeout=120):
    env = sparsync_env(extra_env)
    return subprocess.run([sys.executable, "-m", "sparsync.run"] + args, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_bad_host_options_are_refused_before_anything_starts():
    for args, words in ((["-np", "3", "-H", "a:2,b:2", "true"], "evenly"),
                        (["-np", "2", "-H", "a", "--hostfile", "f", "true"], "exclude"),
                        (["-np", "2", "-H", "a,b", "--nodes", "2", "true"], "--nodes"),
                        (["-np", "2", "--listen", "1.2.3.4", "true"], "needs -H"),
                        (["-np", "2", "-H", "a,b", "--listen", "1.2.3.4", "true"], "one per host"),
                        (["-np", "2", "-H", "a,b", "-x", "1BAD", "true"], "-x 1BAD")):
        r = run_launcher(args)
        assert r.returncode == 2 and words in r.stderr, (args, r.stderr)


# ---- localhost: the node runner without ssh ----

def test_localhost_runs_without_ssh(daemon):
    code = ("import os, sparsync.torch as hvd\nhvd.init()\n"
            "print('hello', hvd.rank(), hvd.size(), hvd.local_rank(), os.environ['FROM_X'])\n"
            "hvd.shutdown()\n")
    r = run_launcher(["-np", "2", "-H", "localhost:2", "-x", "FROM_X=yes", "python", "-c", code],
                     {"SPARSYNC_COMPRESSOR": "none", "SPARSYNC_CALIBRATE": "0"})
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in range(2):
        assert "[%d] hello %d 2 %d yes" % (rank, rank, rank) in r.stdout, r.stdout


# ---- real hosts over ssh ----

@pytest.fixture(scope="module")
def cluster(tmp_path_factory, daemon):
    from hostnet import HostNet, Sshd, can_make_namespaces, known_hosts, ssh_keys
    why = can_make_namespaces()
    if why:
        pytest.skip(why)
    if not os.path.exists("/usr/sbin/sshd") or shutil.which("ssh") is None:
        pytest.skip("needs openssh-server and openssh-client (deploy/install_deps.sh)")
    tmp = tmp_path_factory.mktemp("hosts")
    net = HostNet(HOSTS, prefix="sp19s", octet=19).up()
    sshds = []
    try:
        client_key, host_key = ssh_keys(tmp)
        for i in range(HOSTS - 1):
            sshds.append(Sshd(net, i, tmp, client_key, host_key))
        for s in sshds:
            s.wait_listening()

        class Cluster:
            addresses = [net.address(i) for i in range(HOSTS - 1)]
            ssh_args = ["--ssh-identity-file", str(client_key),
                        "--ssh-option", "UserKnownHostsFile=%s" % known_hosts(
                            tmp, net, range(HOSTS - 1), host_key),
                        "--ssh-option", "StrictHostKeyChecking=yes"]

            def popen(self, args, tag, extra=None):
                env = sparsync_env({"SPARSYNC_COMPRESSOR": "none", "SPARSYNC_CALIBRATE": "0",
                                    "SPARSYNC_TEST_TAG": tag, **(extra or {})})
                return net.popen(LAUNCHER_NS, [sys.executable, "-m", "sparsync.run"]
                                 + self.ssh_args + args, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True,
                                 cwd=str(REPO))

            def run(self, args, tag, extra=None, timeout=120):
                p = self.popen(args, tag, extra)
                out, err = p.communicate(timeout=timeout)
                return p.returncode, out, err

            def hosts(self, slots):
                return ",".join("%s:%d" % (a, slots) for a in self.addresses)

        yield Cluster()
    finally:
        for s in sshds:
            s.stop()
        net.down()


def job_processes(tag):
    """The job's daemons and workers (they have a control socket; the launcher and ssh not)."""
    found = []
    for pid in processes_with_env(tag):
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                if any(kv.startswith(b"SPARSYNC_SOCKET=") for kv in f.read().split(b"\0")):
                    found.append(pid)
        except OSError:
            pass
    return found


def remote_leftovers(tag):
    """Processes of the job still alive: tagged daemons and workers, and node runners."""
    left = processes_with_env(tag)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/cmdline" % entry, "rb") as f:
                    if b"sparsync._node" in f.read():
                        left.append(int(entry))
            except OSError:
                pass
    return left


def wait_nothing_left(tag, timeout=10):
    deadline = time.monotonic() + timeout
    while remote_leftovers(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    return remote_leftovers(tag)


WORKER = """
import os, sys, torch, sparsync.torch as hvd
hvd.init()
t = torch.full((1000,), float(hvd.rank() + 1))
s = hvd.allreduce(t, average=False, name="x")
g = hvd.allgather(torch.tensor([hvd.rank()]), name="g")
with open("/proc/self/cmdline", "rb") as f:
    cmdline = f.read()
print("rank %d of %d local %d node %d sum %g gathered %s token-in-cmdline %s" % (
    hvd.rank(), hvd.size(), hvd.local_rank(), hvd.cross_rank(), s[0].item(),
    g.tolist(), os.environ["SPARSYNC_JOB_TOKEN"].encode() in cmdline))
print("host", os.environ["SSH_CONNECTION"].split()[2] if "SSH_CONNECTION" in os.environ else "-")
hvd.shutdown()
"""


def test_a_job_over_ssh_on_two_hosts(cluster):
    tag = uuid.uuid4().hex
    rc, out, err = cluster.run(["-np", "4", "-H", cluster.hosts(2), "-x", "SPARSYNC_TEST_TAG",
                                "python", "-c", WORKER], tag)
    assert rc == 0, out + err
    for rank in range(4):
        line = "[%d] rank %d of 4 local %d node %d sum 10 gathered [0, 1, 2, 3] " \
               "token-in-cmdline False" % (rank, rank, rank % 2, rank // 2)
        assert line in out, out + err
    # Ranks 0, 1 ran on the first host, 2, 3 on the second, and each daemon bound the address
    # ssh reached its host at.
    for rank, host in ((0, 0), (1, 0), (2, 1), (3, 1)):
        assert "[%d] host %s" % (rank, cluster.addresses[host]) in out, out
    assert "listen %s" % cluster.addresses[1] in out, out  # the daemon's start-up line
    assert "[d0] " in out and "[d1] " in out
    assert wait_nothing_left(tag) == []


def test_the_token_is_on_no_command_line(cluster):
    """While a job runs, no process on any host has the token in its command line."""
    tag = uuid.uuid4().hex
    code = "import time, sparsync.torch as hvd\nhvd.init()\nprint('up', flush=True)\n" \
           "time.sleep(30)\n"
    p = cluster.popen(["-np", "2", "-H", cluster.hosts(1), "python", "-c", code], tag)
    tokens = set()
    try:
        deadline = time.monotonic() + 60
        seen = False
        while time.monotonic() < deadline and not seen:
            pids = job_processes(tag)
            tokens = set()
            for pid in pids:
                try:
                    with open("/proc/%d/environ" % pid, "rb") as f:
                        for kv in f.read().split(b"\0"):
                            if kv.startswith(b"SPARSYNC_JOB_TOKEN="):
                                tokens.add(kv.split(b"=", 1)[1])
                except OSError:
                    pass
            seen = len(tokens) == 1 and len(pids) >= 4  # 2 daemons, 2 workers
            time.sleep(0.2)
        assert seen, "the job did not come up"
        token = tokens.pop()
        assert len(token) >= 32
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open("/proc/%s/cmdline" % entry, "rb") as f:
                        cmdline = f.read()
                except OSError:
                    continue
                assert token not in cmdline, "pid %s has the token on its command line" % entry
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        p.communicate(timeout=60)
    assert wait_nothing_left(tag) == []


def test_an_unreachable_host_fails_within_seconds_naming_it(cluster):
    tag = uuid.uuid4().hex
    nobody = "198.18.19.99"  # on the bridge, but no namespace answers
    start = time.monotonic()
    rc, out, err = cluster.run(["-np", "2", "-H", "%s:1,%s:1" % (cluster.addresses[0], nobody),
                                "--ssh-connect-timeout", "3", "python", "-c", "print('x')"], tag)
    took = time.monotonic() - start
    assert rc != 0
    # The message docs/operations.md's troubleshooting quotes (ssh's own reason varies: no route,
    # or a timeout where the address answers nothing).
    quoted = (r"sparsyncrun: lost {0} \(node 1\): its node runner ended \(exit status 255\): "
              r"ssh: connect to host {0} port 22: ").format(re.escape(nobody))
    assert re.search(quoted, err), err
    assert took < 20, "took %.1f s" % took
    assert wait_nothing_left(tag) == []


def test_the_first_failure_stops_every_host(cluster):
    tag = uuid.uuid4().hex
    code = ("import os, sys, time, sparsync.torch as hvd\nhvd.init()\n"
            "if hvd.rank() == 3:\n    sys.exit(7)\n"
            "time.sleep(120)\n")
    start = time.monotonic()
    rc, out, err = cluster.run(["-np", "4", "-H", cluster.hosts(2), "python", "-c", code], tag)
    assert rc == 7, out + err
    assert "worker rank 3 on %s" % cluster.addresses[1] in err and "exit status 7" in err, err
    assert time.monotonic() - start < 60
    assert wait_nothing_left(tag) == []


# SIGHUP too (issue 16, D12): the exit status is 128 + the signal's number, as shells report it.
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_ctrl_c_or_sigterm_leaves_nothing_on_any_host(cluster, sig):
    tag = uuid.uuid4().hex
    code = "import time, sparsync.torch as hvd\nhvd.init()\nprint('up', flush=True)\n" \
           "time.sleep(300)\n"
    p = cluster.popen(["-np", "4", "-H", cluster.hosts(2), "python", "-c", code], tag)
    deadline = time.monotonic() + 60
    while len(job_processes(tag)) < 6 and time.monotonic() < deadline:  # 2 daemons, 4 workers
        time.sleep(0.2)
    assert len(job_processes(tag)) >= 6, "the job did not come up"
    os.kill(p.pid, sig)  # the launcher alone, as a terminal's Ctrl-C reaches its foreground job
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + sig, out + err
    assert "stopping every host" in err, err
    assert wait_nothing_left(tag) == []
