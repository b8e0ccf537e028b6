"""The emulated cluster's network: P namespaces on a Linux bridge, every link shaped by tbf.

Node i lives in network namespace `<prefix>-n<i>` with address 198.18.0.<i+1>/24 (the
benchmarking range 198.18.0.0/15, RFC 2544) on veth `<prefix>-v<i>`, whose peer `<prefix>-h<i>`
is a port of bridge `<prefix>-br`. A token bucket (tc tbf) at the egress of both ends of every
veth pair limits each direction of each link to the rate (1 Gb/s by default), as a switch with
1 GbE ports would: the namespace side shapes what node i sends, the bridge side what it receives.

Inside node i's namespace the machine's host name resolves to the node's own address, as on a
real node: `ip netns exec` mounts /etc/netns/<namespace>/hosts over /etc/hosts, and setup writes
one (hosts_files). Horovod's Gloo contexts for process sets bind to the address of the host
name, not to HOROVOD_GLOO_IFACE (horovod/common/gloo/gloo_context.cc, 0.28.1); without it they
bind to 127.0.0.1 and the nodes cannot reach each other.

Network objects are named after a prefix ("spsc" by default), so that what a killed run left
behind (namespaces, links, the processes inside the namespaces) can be found and removed
(`cleanup`, harness.py --cleanup). The setup and teardown are command lines that harness.py runs
(or, with --dry-run, prints).
"""

import ipaddress
import os
import signal
import socket
import subprocess
import time

SUBNET = ipaddress.ip_network("198.18.0.0/24")
BENCH_RANGE = ipaddress.ip_network("198.18.0.0/15")
DEFAULT_PREFIX = "spsc"
NETNS_ETC = "/etc/netns"


class Network:
    def __init__(self, nodes, prefix=DEFAULT_PREFIX, rate="1gbit", burst="128kb",
                 latency="10ms"):
        if not 1 <= nodes <= 250:
            raise ValueError("nodes must be in 1..250, got %d" % nodes)
        if not prefix or len(prefix) > 8 or not prefix.replace("-", "").isalnum():
            raise ValueError("prefix must be 1-8 letters, digits or '-', got %r" % prefix)
        self.nodes, self.prefix = nodes, prefix
        self.rate, self.burst, self.latency = rate, burst, latency

    @property
    def bridge(self):
        return "%s-br" % self.prefix

    def namespace(self, i):
        return "%s-n%d" % (self.prefix, i)

    def node_if(self, i):
        """The veth end inside node i's namespace."""
        return "%s-v%d" % (self.prefix, i)

    def bridge_if(self, i):
        """The veth end on the bridge (host namespace)."""
        return "%s-h%d" % (self.prefix, i)

    def address(self, i):
        return str(SUBNET.network_address + 1 + i)

    def in_ns(self, i, argv):
        return ["ip", "netns", "exec", self.namespace(i)] + list(argv)

    def hosts_files(self):
        """[(path, text)]: each namespace's /etc/hosts, naming this machine by the node's
        address; setup writes them after setup_commands."""
        return [("%s/%s/hosts" % (NETNS_ETC, self.namespace(i)),
                 "127.0.0.1 localhost\n::1 localhost\n%s %s\n" % (self.address(i),
                                                                  socket.gethostname()))
                for i in range(self.nodes)]

    def _tbf(self, dev):
        return ["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", self.rate,
                "burst", self.burst, "latency", self.latency]

    def setup_commands(self):
        cmds = [["ip", "link", "add", self.bridge, "type", "bridge"],
                ["ip", "link", "set", self.bridge, "up"]]
        for i in range(self.nodes):
            ns, v, h = self.namespace(i), self.node_if(i), self.bridge_if(i)
            cmds += [
                ["ip", "netns", "add", ns],
                ["ip", "link", "add", h, "type", "veth", "peer", "name", v, "netns", ns],
                ["ip", "link", "set", h, "master", self.bridge],
                ["ip", "link", "set", h, "up"],
                ["ip", "-n", ns, "link", "set", "lo", "up"],
                ["ip", "-n", ns, "addr", "add", "%s/%d" % (self.address(i), SUBNET.prefixlen),
                 "dev", v],
                ["ip", "-n", ns, "link", "set", v, "up"],
                self._tbf(h),
                self.in_ns(i, self._tbf(v)),
            ]
        return cmds

    def teardown_commands(self):
        """Removes everything setup_commands made; each may fail harmlessly when already gone."""
        cmds = []
        for i in range(self.nodes):
            cmds += [self.in_ns(i, ["tc", "qdisc", "del", "dev", self.node_if(i), "root"]),
                     ["tc", "qdisc", "del", "dev", self.bridge_if(i), "root"],
                     ["ip", "link", "del", self.bridge_if(i)],
                     ["ip", "netns", "del", self.namespace(i)],
                     ["rm", "-rf", "%s/%s" % (NETNS_ETC, self.namespace(i))]]
        cmds.append(["ip", "link", "del", self.bridge])
        return cmds


def _lines(argv):
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return r.stdout.splitlines() if r.returncode == 0 else []


def leftovers(prefix):
    """(namespaces, links) whose names carry the prefix."""
    spaces = [line.split()[0] for line in _lines(["ip", "netns", "list"])
              if line.split() and line.split()[0].startswith(prefix + "-n")]
    links = []
    for line in _lines(["ip", "-o", "link", "show"]):
        parts = line.split(":")
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if name.startswith(prefix + "-"):
                links.append(name)
    return spaces, links


def kill_namespace_processes(spaces):
    """SIGTERM, then SIGKILL, every process inside the given namespaces."""
    pids = set()
    for ns in spaces:
        pids.update(int(p) for p in _lines(["ip", "netns", "pids", ns]) if p.strip().isdigit())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in list(pids):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pids.discard(pid)
        if not pids:
            return
        time.sleep(2.0)


def cleanup(prefix, runner):
    """Removes the prefix's namespaces (with their processes and veths) and links."""
    spaces, links = leftovers(prefix)
    kill_namespace_processes(spaces)
    for ns in spaces:
        runner.run(["ip", "netns", "del", ns], check=False)
    for link in sorted(links, key=lambda n: n.endswith("-br")):  # veths first, then the bridge
        runner.run(["ip", "link", "del", link], check=False)
    for etc in _etc_leftovers(prefix):
        runner.run(["rm", "-rf", etc], check=False)
    return spaces, links


def _etc_leftovers(prefix):
    try:
        return sorted(os.path.join(NETNS_ETC, n) for n in os.listdir(NETNS_ETC)
                      if n.startswith(prefix + "-n"))
    except OSError:
        return []
