"""A two-node Slurm cluster on this machine for test_slurm.py: Debian's slurmctld and two slurmd
(nodes sn0 and sn1), each in a network namespace of hostnet.py, authenticating with a munged of
the test's own; started by the test and stopped after it. Slurm's client commands run in node
0's namespace (where slurmctld is), so no traffic leaves the namespaces.

The node names resolve through /etc/netns/<namespace>/hosts, which `ip netns exec` mounts over
/etc/hosts for everything started in the namespace (slurmd, its job steps, the daemons).
"""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from hostnet import HostNet

NODES = ["sn0", "sn1"]


def missing_tools():
    for tool in ("slurmctld", "slurmd", "munged", "mungekey", "sbatch", "srun", "scontrol"):
        if shutil.which(tool) is None and not Path("/usr/sbin/" + tool).exists():
            return tool
    return None


class SlurmCluster:
    def __init__(self, tmp, prefix="sp19l", octet=20):
        self.tmp = Path(tmp)
        self.net = HostNet(len(NODES), prefix, octet)
        self.procs = []
        self.conf = self.tmp / "slurm.conf"
        self.munge_socket = self.tmp / "munge" / "munge.sock"
        self.etc_netns = [Path("/etc/netns") / self.net.namespace(i) for i in range(len(NODES))]

    def env(self, extra=None):
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        env.update(extra or {})
        return env

    def _write_config(self):
        (self.tmp / "state").mkdir()
        for n in NODES:
            (self.tmp / ("spool-" + n)).mkdir()
        (self.tmp / "munge").mkdir(mode=0o711)
        # Slurm's cgroup layer initialises even with proctrack/linuxproc and task/none; it only
        # needs to be told what this machine mounts (cgroup v1 here) and not to mount anything.
        (self.tmp / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
        nodes = "\n".join("NodeName=%s NodeAddr=%s CPUs=%d RealMemory=500 State=UNKNOWN"
                          % (n, self.net.address(i), os.cpu_count())
                          for i, n in enumerate(NODES))
        self.conf.write_text("""\
ClusterName=sparsynctest
SlurmctldHost={ctl}({ctl_addr})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge}
StateSaveLocation={tmp}/state
SlurmdSpoolDir={tmp}/spool-%n
SlurmctldPidFile={tmp}/slurmctld.pid
SlurmdPidFile={tmp}/slurmd-%n.pid
SlurmctldLogFile={tmp}/slurmctld.log
SlurmdLogFile={tmp}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
LaunchParameters=use_interactive_step
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=5
{nodes}
PartitionName=test Nodes={all} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
""".format(ctl=NODES[0], ctl_addr=self.net.address(0), munge=self.munge_socket, tmp=self.tmp,
           nodes=nodes, all=",".join(NODES)))
        hosts = "127.0.0.1 localhost\n" + "".join(
            "%s %s\n" % (self.net.address(i), n) for i, n in enumerate(NODES))
        for d in self.etc_netns:
            d.mkdir(parents=True, exist_ok=True)
            (d / "hosts").write_text(hosts)

    def _start(self, ns, argv, name):
        log = open(self.tmp / (name + ".out"), "wb")
        proc = subprocess.Popen(self.net.in_ns(ns, argv), env=self.env(), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((name, proc, log))
        return proc

    def start(self, timeout=60):
        self.net.up()
        self._write_config()
        key = self.tmp / "munge" / "munge.key"
        subprocess.run(["mungekey", "-c", "-k", str(key)], check=True)
        self._start(0, ["munged", "-F", "-f", "-S", str(self.munge_socket),
                        "--key-file=%s" % key, "--pid-file=%s" % (self.tmp / "munged.pid"),
                        "--seed-file=%s" % (self.tmp / "munged.seed")], "munged")
        self._wait(lambda: self.munge_socket.exists(), 10, "munged's socket")
        # slurmctld must find itself under SlurmctldHost's name: its own UTS namespace.
        self._start(0, ["unshare", "--uts", "sh", "-c",
                        'hostname "$0" && exec slurmctld -D -i -f "$1"', NODES[0],
                        str(self.conf)], "slurmctld")
        for i, n in enumerate(NODES):
            self._start(i, ["slurmd", "-D", "-N", n, "-f", str(self.conf)], "slurmd-" + n)
        self._wait(self._nodes_idle, timeout, "both nodes idle in sinfo")
        return self

    def _nodes_idle(self):
        r = self.client(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
        states = dict(line.split() for line in r.stdout.splitlines() if len(line.split()) == 2)
        return all(states.get(n, "").startswith("idle") for n in NODES)

    def _wait(self, condition, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc, _ in self.procs:
                if proc.poll() is not None:
                    raise AssertionError("%s exited (%s) while waiting for %s\n%s"
                                         % (name, proc.returncode, what, self.logs()))
            if condition():
                return
            time.sleep(0.3)
        raise AssertionError("no %s within %d s\n%s" % (what, timeout, self.logs()))

    def client(self, argv, env=None, check=True, timeout=120):
        """A Slurm command in node 0's namespace."""
        return subprocess.run(self.net.in_ns(0, argv), env=self.env(env), capture_output=True,
                              text=True, check=check, timeout=timeout)

    def logs(self):
        out = []
        for f in sorted(self.tmp.glob("*.log")) + sorted(self.tmp.glob("*.out")):
            out.append("----- %s -----\n%s" % (f.name, f.read_text(errors="replace")[-3000:]))
        return "\n".join(out)

    def stop(self):
        self.client(["scancel", "--user=root"], check=False, timeout=20)
        for name, proc, log in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            log.close()
        self.net.down()  # also every process left in the namespaces (job steps)
        for d in self.etc_netns:
            shutil.rmtree(d, ignore_errors=True)
