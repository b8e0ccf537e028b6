"""One host's side of a multi-host sparsyncrun (`-H`, `--hostfile`; _hosts.py starts it, over ssh
or directly for localhost): `python -m sparsync._node --job ID`.

It runs this host's sparsyncd and workers and is their only link to the launcher:

- stdin carries JSON lines from the launcher: first the host's spec (its node rank, the job's
  environment, the token among it, the command, the ranks), then, on every node but 0, the
  coordinator's address, and finally {"cmd": "stop"}. Nothing secret is on any command line:
  ssh's remote command holds only the job id. End of input (the launcher or its ssh connection
  died) is a stop as well, so a killed launcher leaves nothing behind on this host.
- stdout carries the children's output, each line prefixed "[d<node>] " or "[<rank>] ", and
  the runner's events: lines that begin with the job's nonce (which no child knows) followed by
  JSON: {"ev": "coordinator", "address": ...} (node 0), {"ev": "ready"} (the daemon created its
  socket, so the cluster formed), {"ev": "exit", ...} (a child ended), {"ev": "done"} (every
  worker here exited 0), {"ev": "error", "message": ...}.

On a stop it sends SIGTERM to every child's process group, SIGKILL after a grace period, removes
its private socket directory and exits.
"""

import argparse
import fcntl
import json
import os
import queue
import shutil
import signal
import socket
import struct
import sys
import tempfile
import threading
import time

from sparsync.run import _Child, _describe_exit

_GRACE_S = 5.0
_SIOCGIFADDR = 0x8915


class _Stop(Exception):
    """The launcher said stop, or its connection ended."""


def interface_address(name):
    """The IPv4 address of network interface `name` on this host."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR,
                                 struct.pack("256s", name.encode()[:15]))
        except OSError as e:
            raise RuntimeError("--network-interface %s: this host has no IPv4 address on it (%s)"
                               % (name, e.strerror))
    return socket.inet_ntoa(packed[20:24])


def listen_address(spec, environ):
    """The address this host's daemon binds: the one given, the interface's, else the address
    the launcher reached this host at (ssh's SSH_CONNECTION), else loopback."""
    if spec.get("listen"):
        return spec["listen"]
    if spec.get("interface"):
        return interface_address(spec["interface"])
    conn = environ.get("SSH_CONNECTION", "").split()
    return conn[2] if len(conn) == 4 else "127.0.0.1"


def free_port(address):
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


class NodeRunner:
    def __init__(self, spec, nonce):
        self.spec, self.nonce = spec, nonce
        self.events = queue.Queue()  # (child, rc) and ("cmd", message)
        self.out_lock = threading.Lock()
        self.daemon, self.workers = None, []
        self.tmpdir = None

    def emit(self, event, **fields):
        fields["ev"] = event
        with self.out_lock:
            sys.stdout.write("%s%s\n" % (self.nonce, json.dumps(fields)))
            sys.stdout.flush()

    def _command(self, timeout):
        """The launcher's next message, skipping child exits (recorded), or None on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                item = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if item[0] != "cmd":
                self._child_ended(*item)
                continue
            message = item[1]
            if message is None or message.get("cmd") == "stop":
                raise _Stop()
            return message

    def _child_ended(self, child, rc):
        self.emit("exit", kind=child.kind, index=child.index, rc=rc, pid=child.proc.pid,
                  how=_describe_exit(rc))

    def run(self):
        spec = self.spec
        node = spec["node_rank"]
        self.tmpdir = tempfile.mkdtemp(prefix="sparsyncrun-")
        os.chmod(self.tmpdir, 0o700)
        socket_path = os.path.join(self.tmpdir, "node%d.sock" % node)
        try:
            listen = listen_address(spec, os.environ)
            if node == 0:
                coordinator = "%s:%d" % (listen, free_port(listen))
                self.emit("coordinator", address=coordinator)
            else:
                message = self._command(spec["start_timeout_s"])
                if message is None or "coordinator" not in message:
                    self.emit("error", message="no coordinator address came within %.0f s"
                              % spec["start_timeout_s"])
                    return
                coordinator = message["coordinator"]
            env = self._base_env()
            env.update({
                "SPARSYNC_NODE_RANK": str(node), "SPARSYNC_NUM_NODES": str(spec["num_nodes"]),
                "SPARSYNC_COORDINATOR": coordinator, "SPARSYNC_LISTEN": listen,
                "SPARSYNC_SOCKET": socket_path, "SPARSYNC_LOCAL_SIZE": str(spec["local_size"]),
            })
            try:
                self.daemon = _Child("d%d" % node, "daemon", node, [spec["daemon"]], env,
                                     self.out_lock, self.events)
            except OSError as e:
                self.emit("error", message="cannot start the daemon %s: %s" % (spec["daemon"], e))
                return
            if not self._wait_for_socket(socket_path):
                return
            self.emit("ready")
            self._start_workers(socket_path)
            self._supervise()
        except _Stop:
            pass
        except RuntimeError as e:
            self.emit("error", message=str(e))
        finally:
            self._stop()
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    def _base_env(self):
        env = dict(os.environ)
        env.update(self.spec["env"])
        bindir = self.spec.get("bindir")
        if bindir and "PATH" not in self.spec["env"]:
            env["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
        return env

    def _wait_for_socket(self, path):
        deadline = time.monotonic() + self.spec["start_timeout_s"]
        while not os.path.exists(path):
            try:
                item = self.events.get(timeout=0.05)
            except queue.Empty:
                item = None
            if item is not None and item[0] == "cmd":
                if item[1] is None or item[1].get("cmd") == "stop":
                    raise _Stop()
            elif item is not None:
                self._child_ended(*item)
                return False
            if time.monotonic() > deadline:
                self.emit("error", message="the daemon did not create its socket within %.0f s "
                          "(--timeout-s): the cluster did not form" % self.spec["start_timeout_s"])
                return False
        return True

    def _start_workers(self, socket_path):
        spec = self.spec
        for local in range(spec["local_size"]):
            rank = spec["first_rank"] + local
            env = self._base_env()
            env.update({
                "SPARSYNC_SOCKET": socket_path, "SPARSYNC_LOCAL_RANK": str(local),
                "SPARSYNC_RANK": str(rank), "SPARSYNC_SIZE": str(spec["size"]),
                "PYTHONUNBUFFERED": "1",
            })
            try:
                self.workers.append(_Child(str(rank), "worker", rank, spec["command"], env,
                                           self.out_lock, self.events))
            except OSError as e:
                self.emit("exit", kind="worker", index=rank, rc=127, pid=-1,
                          how="cannot start %r: %s" % (spec["command"][0], e))
                return

    def _supervise(self):
        finished = 0
        while True:
            item = self.events.get()
            if item[0] == "cmd":
                if item[1] is None or item[1].get("cmd") == "stop":
                    raise _Stop()
                continue
            child, rc = item
            self._child_ended(child, rc)
            if child.kind == "worker" and rc == 0:
                finished += 1
                if finished == len(self.workers):
                    self.emit("done")

    def _stop(self):
        children = [c for c in self.workers + [self.daemon] if c is not None]
        alive = [c for c in children if c.proc.returncode is None]
        for c in alive:
            c.signal(signal.SIGTERM)
        deadline = time.monotonic() + _GRACE_S
        for c in alive:
            try:
                c.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except Exception:  # subprocess.TimeoutExpired
                pass
        for c in children:
            try:  # what did not stop, and anything it left in its process group
                os.killpg(c.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            c.proc.wait()
            c.reader.join(timeout=2.0)


def _read_stdin(events):
    for line in sys.stdin:
        line = line.strip()
        if line:
            try:
                events.put(("cmd", json.loads(line)))
            except ValueError:
                events.put(("cmd", {"cmd": "stop"}))  # not the launcher speaking
                return
    events.put(("cmd", None))  # end of input: the launcher is gone


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m sparsync._node")
    p.add_argument("--job", required=True, help="the job's id (for ps; not a secret)")
    p.parse_args(sys.argv[1:] if argv is None else argv)
    for s in (signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)  # the launcher decides; end of input stops us
    first = sys.stdin.readline()
    try:
        spec = json.loads(first)
        nonce = spec.pop("nonce")
    except (ValueError, KeyError, AttributeError):
        sys.stderr.write("sparsync._node: expected the launcher's spec on stdin\n")
        return 2
    runner = NodeRunner(spec, nonce)

    def on_term(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the clean-up must not be cut short
        raise _Stop()

    signal.signal(signal.SIGTERM, on_term)
    threading.Thread(target=_read_stdin, args=(runner.events,), daemon=True).start()
    try:
        runner.run()
    except _Stop:  # SIGTERM before run() could catch it
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
