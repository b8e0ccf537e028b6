"""Hosts for the multi-host tests: network namespaces on a bridge, in the benchmarking range
198.18.0.0/15 (RFC 2544), made and removed by the test (needs root).

Host i is namespace `<prefix>-n<i>` at 198.18.<octet>.<i+1>, on bridge `<prefix>-br`; the test
runs the launcher (or Slurm's client commands) inside one of them as well, so that no traffic
leaves the namespaces. They share this machine's file system (the checkout, the venv, the
build), as the nodes of a cluster with a shared file system do. `Sshd` runs Debian's sshd in a
namespace with a key of the test's; `KnownHosts`/`ClientKey` give the launcher what ssh needs.
Everything is named after the prefix so that a killed run's leftovers can be found and removed.
"""

import ipaddress
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "cluster"))

import netns  # noqa: E402  (bench/cluster/netns.py: namespaces on a bridge)


def can_make_namespaces():
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None:
        return "needs iproute2"
    return None


class HostNet(netns.Network):
    """netns.Network on subnet 198.18.<octet>.0/24, links at 10 Gb/s (the tests do not measure
    bandwidth)."""

    def __init__(self, nodes, prefix, octet):
        super().__init__(nodes, prefix=prefix, rate="10gbit", burst="1mb", latency="50ms")
        self.subnet = ipaddress.ip_network("198.18.%d.0/24" % octet)
        assert self.subnet.subnet_of(netns.BENCH_RANGE)

    def address(self, i):
        return str(self.subnet.network_address + 1 + i)

    def up(self):
        self.down()  # what a killed run left
        for cmd in self.setup_commands():
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        return self

    def down(self):
        spaces, _ = netns.leftovers(self.prefix)
        netns.kill_namespace_processes(spaces)
        for cmd in self.teardown_commands():
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for ns in netns.leftovers(self.prefix)[0]:
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)

    def popen(self, i, argv, **kwargs):
        return subprocess.Popen(self.in_ns(i, argv), **kwargs)

    def run(self, i, argv, **kwargs):
        return subprocess.run(self.in_ns(i, argv), **kwargs)


def ssh_keys(tmp):
    """(client key, host key) made for this test (ed25519, no passphrase)."""
    keys = []
    for name in ("client", "host"):
        path = tmp / name
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sparsync-test",
                        "-f", str(path)], check=True)
        keys.append(path)
    return keys


class Sshd:
    """Debian's sshd in namespace `i`, on port 22 of its address, taking the client key only."""

    def __init__(self, net, i, tmp, client_key, host_key):
        self.net, self.i = net, i
        d = tmp / ("sshd%d" % i)
        d.mkdir()
        (d / "authorized_keys").write_text(Path(str(client_key) + ".pub").read_text())
        self.config = d / "sshd_config"
        self.config.write_text("\n".join([
            "ListenAddress %s" % net.address(i),
            "Port 22",
            "HostKey %s" % host_key,
            "AuthorizedKeysFile %s" % (d / "authorized_keys"),
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "PermitRootLogin prohibit-password",
            "StrictModes no",  # the test's files live in /tmp
            "UsePAM no",
            "PidFile %s" % (d / "sshd.pid"),
            "LogLevel ERROR",
            "",
        ]))
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
        self.log = open(d / "sshd.log", "wb")
        self.proc = net.popen(i, ["/usr/sbin/sshd", "-D", "-e", "-f", str(self.config)],
                              stdout=self.log, stderr=subprocess.STDOUT)

    def wait_listening(self, timeout=10):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("sshd in namespace %d exited: %s"
                                     % (self.i, Path(self.log.name).read_text()))
            r = self.net.run(self.i, ["ss", "-Hltn", "sport = :22"], capture_output=True,
                             text=True)
            if r.stdout.strip():
                return
            time.sleep(0.1)
        raise AssertionError("sshd in namespace %d did not listen within %d s" % (self.i, timeout))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def known_hosts(tmp, net, hosts, host_key):
    path = tmp / "known_hosts"
    key = Path(str(host_key) + ".pub").read_text().split()
    path.write_text("".join("%s %s %s\n" % (net.address(i), key[0], key[1]) for i in hosts))
    return path
