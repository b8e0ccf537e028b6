"""sparsyncrun on several hosts (`-H host1:2,host2:2`, `--hostfile FILE`): host lists, the ssh
command lines, the job's environment, and the launcher that supervises one node runner per host
(sparsync/_node.py, started over OpenSSH, or directly for localhost).

Every host runs one sparsyncd and its share of the workers; ranks fill the hosts in the order
given, as horovodrun and mpirun do, and every host must get the same number of workers (the
daemons serve SPARSYNC_LOCAL_SIZE workers each). The job's token, its environment and the command
go to each node runner over ssh's stdin, never on a command line (ssh's remote command line is
visible in ps on the remote host). The first failure anywhere stops every host; so do Ctrl-C and
SIGTERM; a launcher that dies leaves nothing running either, since each node runner stops its
children when its input ends.
"""

import json
import os
import queue
import re
import secrets
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

from sparsync._signal_gate import GATE

_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}
_STDERR_TAIL = 5  # ssh's last lines, quoted when a connection ends
# How long a node runner may take to stop its host's processes (it gives them 5 s after SIGTERM).
_STOP_WAIT_S = 10.0


class HostError(ValueError):
    pass


def _add_host(hosts, name, slots, where):
    if not name or slots < 1:
        raise HostError("%s: '%s' needs a host name and at least one slot" % (where, name))
    for h in hosts:
        if h[0] == name:
            h[1] += slots  # Open MPI's "host,host": slots add up
            return
    hosts.append([name, slots])


def _split_host(item, where):
    """'host', 'host:N', '[v6addr]:N' -> (host, slots or None)."""
    m = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?|([^:\s]+)(?::(\d+))?", item)
    if not m:
        raise HostError("%s: '%s' is not host or host:slots" % (where, item))
    name = m.group(1) or m.group(3)
    slots = m.group(2) or m.group(4)
    return name, int(slots) if slots else None


def parse_host_list(text):
    """-H: "host1:2,host2:2" (Horovod) or "host1,host1,host2" (Open MPI: a repeated host gets
    one slot per mention). Returns [(host, slots)] in order."""
    hosts = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise HostError("-H %s: an empty host" % text)
        name, slots = _split_host(item, "-H")
        _add_host(hosts, name, 1 if slots is None else slots, "-H")
    return [tuple(h) for h in hosts]


def parse_hostfile(text, path="hostfile"):
    """A hostfile in Horovod's and mpirun's formats, one host a line: "host slots=N" (Horovod,
    Open MPI, which also allows max_slots=M, ignored here), "host:N" (MPICH), or "host" (one
    slot); '#' starts a comment."""
    hosts = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = "%s line %d" % (path, number)
        words = line.split()
        name, slots = _split_host(words[0], where)
        for word in words[1:]:
            key, _, value = word.partition("=")
            if key in ("slots", "max_slots", "max-slots") and value.isdigit():
                if key == "slots":
                    slots = int(value)
            else:
                raise HostError("%s: '%s' is not slots=N" % (where, word))
        _add_host(hosts, name, 1 if slots is None else slots, where)
    if not hosts:
        raise HostError("%s names no host" % path)
    return [tuple(h) for h in hosts]


def assign(hosts, np_):
    """Ranks fill the hosts in order, each up to its slots: [(host, first_rank, count)] of the
    hosts that get workers. Every host must get the same count."""
    total = sum(s for _, s in hosts)
    if np_ > total:
        raise HostError("-np %d but the hosts have %d slots (%s)"
                        % (np_, total, ",".join("%s:%d" % h for h in hosts)))
    out, rank = [], 0
    for name, slots in hosts:
        count = min(slots, np_ - rank)
        if count == 0:
            break
        out.append((name, rank, count))
        rank += count
    counts = [c for _, _, c in out]
    if len(set(counts)) > 1:
        raise HostError("-np %d over %s gives %s workers per host, but every sparsync node serves "
                        "the same number of workers: choose -np and slots so that it divides "
                        "evenly" % (np_, ",".join("%s:%d" % h for h in hosts),
                                    ", ".join(map(str, counts))))
    return out


def add_arguments(parser):
    g = parser.add_argument_group("several hosts (over OpenSSH)")
    g.add_argument("-H", "--hosts", metavar="HOST[:SLOTS],...",
                   help="run on these hosts, one sparsyncd each: host1:2,host2:2 (Horovod) or "
                        "host1,host1,host2 (Open MPI); localhost runs without ssh")
    g.add_argument("--hostfile", metavar="FILE",
                   help="hosts one a line: 'host slots=N' (Horovod, Open MPI), 'host:N' (MPICH) "
                        "or 'host'")
    g.add_argument("--ssh-port", type=int, metavar="PORT", help="ssh's port on every host")
    g.add_argument("--ssh-identity-file", metavar="FILE", help="ssh's private key (ssh -i)")
    g.add_argument("--ssh-option", action="append", default=[], metavar="OPT",
                   help="an ssh option (ssh -o OPT), e.g. UserKnownHostsFile=/path; repeatable")
    g.add_argument("--ssh-connect-timeout", type=float, default=10.0, metavar="S",
                   help="how long ssh may take to reach a host before the job fails naming it "
                        "(default: 10)")
    g.add_argument("-x", dest="exports", action="append", default=[], metavar="VAR[=VALUE]",
                   help="also give the workers and daemons VAR (from this environment, or VALUE), "
                        "as mpirun -x does; repeatable. SPARSYNC_*, PYTHONPATH, VIRTUAL_ENV and "
                        "PATH (with this Python's directory first) always go")
    g.add_argument("--network-interface", metavar="IFACE",
                   help="each daemon binds its address on IFACE (the same name on every host)")
    g.add_argument("--listen", metavar="ADDR,...",
                   help="the address each daemon binds, one per host in host order (default: "
                        "the address ssh reached the host at; 127.0.0.1 for localhost)")


def check_arguments(parser, args):
    """Validates the host options (parser.error on a bad combination); returns the assignment
    or None when no host was given."""
    if not args.hosts and not args.hostfile:
        for option in ("ssh_port", "ssh_identity_file", "network_interface", "listen"):
            if getattr(args, option):
                parser.error("--%s needs -H or --hostfile" % option.replace("_", "-"))
        return None
    if args.hosts and args.hostfile:
        parser.error("-H and --hostfile exclude each other")
    if args.nodes is not None:
        parser.error("--nodes simulates nodes on this machine; with -H or --hostfile every host "
                     "is a node")
    if args.network_interface and args.listen:
        parser.error("--network-interface and --listen exclude each other")
    try:
        if args.hosts:
            hosts = parse_host_list(args.hosts)
        else:
            path = Path(args.hostfile)
            try:
                hosts = parse_hostfile(path.read_text(), str(path))
            except OSError as e:
                raise HostError("--hostfile %s: %s" % (path, e.strerror))
        placed = assign(hosts, args.np)
    except HostError as e:
        parser.error(str(e))
    listens = args.listen.split(",") if args.listen else []
    if listens and len(listens) != len(placed):
        parser.error("--listen names %d address(es) for %d host(s): give one per host"
                     % (len(listens), len(placed)))
    for spec in args.exports:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(=.*)?", spec, re.DOTALL):
            parser.error("-x %s: expected VAR or VAR=VALUE" % spec)
    return placed


def job_environment(environ, exports):
    """What every daemon and worker gets from this environment (see add_arguments' -x)."""
    env = {k: v for k, v in environ.items()
           if k.startswith("SPARSYNC_") or k in ("PYTHONPATH", "VIRTUAL_ENV")}
    for spec in exports:
        name, eq, value = spec.partition("=")
        if eq:
            env[name] = value
        elif name in environ:
            env[name] = environ[name]
    return env


def ssh_command(host, args, remote_argv):
    """The argv that runs `remote_argv` (a list, quoted here for the remote shell) on `host`."""
    argv = ["ssh", "-o", "BatchMode=yes",
            "-o", "ConnectTimeout=%d" % max(1, round(args.ssh_connect_timeout)),
            "-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3"]
    if args.ssh_port:
        argv += ["-p", str(args.ssh_port)]
    if args.ssh_identity_file:
        argv += ["-i", args.ssh_identity_file]
    for option in args.ssh_option:
        argv += ["-o", option]
    return argv + [host, " ".join(shlex.quote(a) for a in remote_argv)]


class _Connection:
    """One host's node runner: its process (ssh, or the runner itself for localhost), the
    threads that read its output, and what it said."""

    def __init__(self, index, host, argv, nonce, events, out_lock):
        self.index, self.host, self.nonce = index, host, nonce
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True,
                                     close_fds=True)
        self.stderr_tail = []
        self._events, self._out_lock = events, out_lock
        self._stderr_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._threads = [threading.Thread(target=self._read_stdout, daemon=True),
                         self._stderr_reader]
        for t in self._threads:
            t.start()

    def send(self, message):
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, ValueError, OSError):
            return False

    def close_input(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def _read_stdout(self):
        mark = self.nonce.encode()
        out = sys.stdout.buffer
        for line in iter(self.proc.stdout.readline, b""):
            if line.startswith(mark):
                try:
                    self._events.put((self, json.loads(line[len(mark):])))
                except ValueError:
                    pass
                continue
            with self._out_lock:
                out.write(line if line.endswith(b"\n") else line + b"\n")
                out.flush()
        rc = self.proc.wait()
        # Its last words (ssh's "Connection timed out") may still be in the stderr pipe: the
        # message of the "closed" event is read from stderr_tail.
        self._stderr_reader.join(timeout=2.0)
        self._events.put((self, {"ev": "closed", "rc": rc}))

    def _read_stderr(self):
        for line in iter(self.proc.stderr.readline, b""):
            text = line.decode(errors="replace").rstrip()
            self.stderr_tail = (self.stderr_tail + [text])[-_STDERR_TAIL:]
            with self._out_lock:
                sys.stderr.write("[%s] %s\n" % (self.host, text))
                sys.stderr.flush()

    def join(self):
        for t in self._threads:
            t.join(timeout=2.0)


class MultiHostLauncher:
    """Runs the job on the hosts of `placed` ([(host, first_rank, count)])."""

    def __init__(self, args, placed, daemon, failure, interrupted):
        self.args, self.placed, self.daemon = args, placed, daemon
        self._Failure, self._Interrupted = failure, interrupted  # run.py's exceptions
        self.events = queue.Queue()
        self.out_lock = threading.Lock()
        self.connections = []
        self.deferred = []  # events that came while waiting for others (a host done early)
        self.nonce = "\x1e" + secrets.token_hex(8) + " "
        self.job = secrets.token_hex(4)

    def _log(self, message):
        with self.out_lock:
            sys.stderr.write("sparsyncrun: %s\n" % message)
            sys.stderr.flush()

    def run(self):
        try:
            self._start()
            self._supervise()
            return 0
        except self._Failure as f:
            self._log(f.args[0])
            return f.args[1] if len(f.args) > 1 else 1
        except self._Interrupted as e:
            self._log("%s: stopping every host" % e.args[0])
            return 128 + e.args[1]  # as shells report a death by that signal (130, 143, 129)
        finally:
            self._stop()

    def _remote_argv(self):
        package_root = str(Path(__file__).resolve().parents[1])
        return ["sh", "-c", 'cd "$1" && PYTHONPATH="$2${PYTHONPATH:+:$PYTHONPATH}" exec "$3" -u '
                '-m sparsync._node --job "$4"', "sparsync", os.getcwd(), package_root,
                sys.executable, self.job]

    def _start(self):
        args = self.args
        env = job_environment(os.environ, args.exports)
        env["SPARSYNC_JOB_TOKEN"] = secrets.token_hex(16)
        listens = args.listen.split(",") if args.listen else [None] * len(self.placed)
        size = sum(c for _, _, c in self.placed)
        for i, (host, first, count) in enumerate(self.placed):
            remote = self._remote_argv()
            argv = remote if host in _LOCAL_HOSTS else ssh_command(host, args, remote)
            with GATE.holding():  # started means recorded (_signal_gate.py)
                try:
                    conn = _Connection(i, host, argv, self.nonce, self.events, self.out_lock)
                except OSError as e:
                    raise self._Failure("cannot run %s: %s" % (argv[0], e), 127)
                self.connections.append(conn)
            conn.send({
                "nonce": self.nonce, "node_rank": i, "num_nodes": len(self.placed),
                "local_size": count, "first_rank": first, "size": size,
                "command": args.command, "daemon": self.daemon, "env": env,
                "bindir": os.path.dirname(os.path.abspath(sys.executable)),
                "listen": listens[i] or ("127.0.0.1" if host in _LOCAL_HOSTS else None),
                "interface": args.network_interface, "start_timeout_s": args.timeout_s,
            })
        coordinator = self._wait_for(lambda c, ev: c.index == 0 and ev["ev"] == "coordinator",
                                     "node 0's coordinator address")
        for conn in self.connections[1:]:
            conn.send({"coordinator": coordinator[0]["address"]})
        ready = self._wait_for(lambda c, ev: ev["ev"] == "ready", "the daemons' sockets",
                               count=len(self.connections))
        self._log("%d hosts ready (coordinator %s)" % (len(ready), coordinator[0]["address"]))

    def _wait_for(self, wanted, what, count=1):
        """Events that match `wanted` until `count` came; any failure first raises it."""
        deadline = time.monotonic() + self.args.timeout_s + self.args.ssh_connect_timeout
        got, seen = [], set()
        while len(got) < count:
            try:
                conn, ev = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                missing = [c.host for c in self.connections if c.index not in seen]
                raise self._Failure("waited %.0f s for %s: nothing came from %s"
                                    % (self.args.timeout_s, what, ", ".join(missing)))
            if wanted(conn, ev):
                got.append(ev)
                seen.add(conn.index)
            else:
                self._check(conn, ev)
                self.deferred.append((conn, ev))
        return got

    def _check(self, conn, ev):
        """Raises the failure an event means, if any."""
        kind = ev["ev"]
        where = "%s (node %d)" % (conn.host, conn.index)
        if kind == "closed":
            tail = "; ".join(conn.stderr_tail) or "no message"
            raise self._Failure("lost %s: its node runner ended (exit status %s): %s"
                                % (where, ev["rc"], tail), 255 if ev["rc"] == 255 else 1)
        if kind == "error":
            raise self._Failure("%s: %s" % (where, ev["message"]))
        if kind == "exit" and (ev["kind"] == "daemon" or ev["rc"] != 0):
            who = ("worker rank %d" % ev["index"] if ev["kind"] == "worker"
                   else "daemon of node %d" % ev["index"])
            rc = ev["rc"]
            code = 1 if rc in (None, 0) else (rc if rc > 0 else 128 - rc)
            raise self._Failure("%s on %s (pid %d) failed first: %s"
                                % (who, conn.host, ev["pid"], ev["how"]), code)

    def _supervise(self):
        done = set()
        while len(done) < len(self.connections):
            conn, ev = self.deferred.pop(0) if self.deferred else self.events.get()
            if ev["ev"] == "done":
                done.add(conn.index)
                continue
            self._check(conn, ev)

    def _stop(self):
        for conn in self.connections:
            conn.send({"cmd": "stop"})
            conn.close_input()
        deadline = time.monotonic() + _STOP_WAIT_S
        for conn in self.connections:
            try:
                conn.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._log("%s did not end within %.0f s of the stop: killing its connection"
                          % (conn.host, _STOP_WAIT_S))
                conn.proc.kill()
                conn.proc.wait()
        for conn in self.connections:
            conn.join()

