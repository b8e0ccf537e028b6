"""A job of N simulated nodes for the fault trials and the soak: one sparsyncd and one worker
(worker.py) per node, each daemon in its own network namespace on a bridge (198.18.0.0/24 from
bench/cluster/netns.py, so that a link can be cut) or, without namespaces, on loopback.

Every process carries SPARSYNC_TEST_TAG=<tag> in its environment, which is how `leftovers`
finds what a job left behind: live processes, their memfd regions, socket and token files.
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

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "bench" / "cluster"))
sys.path.insert(0, str(REPO / "shims" / "python"))

import netns  # noqa: E402
from sparsync._paths import find_daemon  # noqa: E402

STOP_GRACE_S = 5.0  # what sparsyncrun gives a daemon between SIGTERM and SIGKILL


class Proc:
    """One process of the job, its log, and when it ended."""

    def __init__(self, label, argv, env, log_path):
        self.label, self.log_path = label, log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.ended_at = None
        self.killed = False  # needed SIGKILL from the harness

    @property
    def pid(self):
        return self.proc.pid

    def poll(self):
        rc = self.proc.poll()
        if rc is not None and self.ended_at is None:
            self.ended_at = time.monotonic()
        return rc

    def signal(self, sig):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def log(self):
        try:
            return Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _live(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(") ", 1)[-1][0] != "Z"
    except OSError:
        return False


def tagged_processes(tag):
    """PIDs of live processes whose environment holds SPARSYNC_TEST_TAG=<tag>."""
    needle = ("SPARSYNC_TEST_TAG=%s" % tag).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as f:
                if needle in f.read().split(b"\0") and _live(int(entry)):
                    found.append(int(entry))
        except OSError:
            pass
    return found


def memfds(pids):
    """memfd regions of sparsync ("memfd:sparsync:...") open in the given processes."""
    found = []
    for pid in pids:
        try:
            for fd in os.listdir("/proc/%d/fd" % pid):
                target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
                if target.startswith("/memfd:sparsync"):
                    found.append("%d:%s" % (pid, target))
        except OSError:
            pass
    return found


def sample(pid):
    """(VmRSS in KiB, open descriptors) of a process, or None when it is gone."""
    try:
        with open("/proc/%d/status" % pid) as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        return rss, len(os.listdir("/proc/%d/fd" % pid))
    except (OSError, StopIteration):
        return None


class Network:
    """The namespaces of the job (netns.Network) and the commands that change their links."""

    def __init__(self, nodes, prefix):
        self.net = netns.Network(nodes, prefix=prefix, rate="10gbit")

    def setup(self):
        self.teardown()
        for argv in self.net.setup_commands():
            subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def teardown(self):
        spaces, _links = netns.leftovers(self.net.prefix)
        netns.kill_namespace_processes(spaces)
        for argv in self.net.teardown_commands():
            subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def set_link(self, node, up):
        subprocess.run(["ip", "-n", self.net.namespace(node), "link", "set",
                        self.net.node_if(node), "up" if up else "down"], check=True)

    def namespace_pids(self):
        pids = []
        for i in range(self.net.nodes):
            r = subprocess.run(["ip", "netns", "pids", self.net.namespace(i)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            pids += [int(p) for p in r.stdout.split()]
        return pids


class Job:
    """N daemons and N workers (one per node). `network` None: everything on loopback."""

    def __init__(self, nodes, env, network=None, daemon=None, worker_env=None, root=None):
        self.nodes, self.network = nodes, network
        self.daemon = daemon or find_daemon()
        self.tag = secrets.token_hex(6)
        self.token = secrets.token_hex(16)
        self.dir = Path(tempfile.mkdtemp(prefix="spf-", dir=root))  # mode 0700
        self.env = dict(env)
        self.worker_env = dict(worker_env or {})
        self.daemons, self.workers = [], []

    def address(self, i):
        return self.network.net.address(i) if self.network else "127.0.0.1"

    def socket(self, i):
        return str(self.dir / ("n%d.sock" % i))

    def _base_env(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPARSYNC_")}
        if "SPARSYNC_DAEMON" in os.environ:
            env["SPARSYNC_DAEMON"] = os.environ["SPARSYNC_DAEMON"]
        env.update({"SPARSYNC_TEST_TAG": self.tag, "PYTHONUNBUFFERED": "1",
                    "PYTHONPATH": str(REPO / "shims" / "python")})
        env.update(self.env)
        return env

    def start(self, timeout_s=60.0):
        port = free_port()
        for i in range(self.nodes):
            env = self._base_env()
            env.update({"SPARSYNC_NODE_RANK": str(i), "SPARSYNC_NUM_NODES": str(self.nodes),
                        "SPARSYNC_COORDINATOR": "%s:%d" % (self.address(0), port),
                        "SPARSYNC_LISTEN": self.address(i), "SPARSYNC_SOCKET": self.socket(i),
                        "SPARSYNC_LOCAL_SIZE": "1", "SPARSYNC_JOB_TOKEN": self.token})
            argv = [self.daemon]
            if self.network:
                argv = self.network.net.in_ns(i, argv)
            self.daemons.append(Proc("d%d" % i, argv, env, self.dir / ("d%d.log" % i)))
        deadline = time.monotonic() + timeout_s
        while not all(os.path.exists(self.socket(i)) for i in range(self.nodes)):
            for d in self.daemons:
                if d.poll() is not None:
                    raise RuntimeError("%s ended during start-up\n%s" % (d.label, d.log()[-3000:]))
            if time.monotonic() > deadline:
                raise RuntimeError("the daemons did not create their sockets")
            time.sleep(0.05)
        for i in range(self.nodes):
            env = self._base_env()
            env.update({"SPARSYNC_SOCKET": self.socket(i), "SPARSYNC_JOB_TOKEN": self.token,
                        "SPARSYNC_LOCAL_RANK": "0", "SPARSYNC_RANK": str(i)})
            env.update(self.worker_env)
            self.workers.append(Proc("w%d" % i, [sys.executable, str(HERE / "worker.py")], env,
                                     self.dir / ("w%d.log" % i)))

    def steps_done(self, worker):
        return self.workers[worker].log().count("step ")

    def stop_daemons(self, grace_s=STOP_GRACE_S):
        """SIGTERM and SIGCONT (a stopped daemon must run to handle it), SIGKILL after grace_s."""
        alive = [d for d in self.daemons if d.poll() is None]
        for d in alive:
            d.signal(signal.SIGTERM)
            d.signal(signal.SIGCONT)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(d.poll() is None for d in alive):
            time.sleep(0.02)
        for d in alive:
            if d.poll() is None:
                d.killed = True
                d.signal(signal.SIGKILL)
                d.proc.wait()
                d.poll()

    def kill_everything(self):
        for p in self.workers + self.daemons:
            if p.poll() is None:
                p.killed = True
                p.signal(signal.SIGKILL)
                p.signal(signal.SIGCONT)
                p.proc.wait()
                p.poll()

    def leftovers(self, killed=()):
        """What the job left: processes, memfds, files in its directory other than logs. The
        socket and token file of a daemon killed with SIGKILL (nodes `killed`) do not count: it
        could not remove them; the next daemon on that path replaces them, and sparsyncrun
        removes its whole directory."""
        pids = tagged_processes(self.tag)
        theirs = set()
        for i in killed:
            theirs |= {os.path.basename(self.socket(i)), os.path.basename(self.socket(i)) + ".token"}
        files = sorted(p.name for p in self.dir.iterdir()
                       if not p.name.endswith(".log") and p.name not in theirs)
        out = {"processes": pids, "memfds": memfds(pids), "files": files}
        if self.network:
            out["namespace_processes"] = self.network.namespace_pids()
        return out

    def remove(self):
        shutil.rmtree(self.dir, ignore_errors=True)
