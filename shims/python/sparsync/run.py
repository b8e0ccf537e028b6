"""sparsyncrun: runs a training command on N workers over M simulated nodes on this machine.

Starts M sparsyncd daemons (one per simulated node, talking over loopback) and N worker
processes, prefixes their output, and tears everything down when the job ends or fails.
"""

import argparse
import os
import queue
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from sparsync import _hosts
from sparsync._paths import find_daemon
from sparsync._signal_gate import GATE

_GRACE_S = 5.0

_DESCRIPTION = """\
Run CMD as N workers on this machine, spread over M simulated nodes, each node served by its own
sparsyncd daemon (the daemons talk to each other over loopback, so the network path is always
exercised).

sparsyncrun makes a private temporary directory (mode 0700) for the daemons' control sockets,
picks a free loopback port for node 0's coordinator, and starts the M daemons with
SPARSYNC_NODE_RANK, SPARSYNC_NUM_NODES, SPARSYNC_COORDINATOR, SPARSYNC_LISTEN=127.0.0.1,
SPARSYNC_SOCKET, SPARSYNC_LOCAL_SIZE=N/M and a random SPARSYNC_JOB_TOKEN; every other SPARSYNC_*
variable (e.g. SPARSYNC_COMPRESSOR, SPARSYNC_TIMEOUT_S) passes through to daemons and workers
unchanged. Once every daemon has created its socket, it starts the workers: global rank r runs
on node r // (N/M) with local rank r % (N/M) and gets SPARSYNC_SOCKET, SPARSYNC_JOB_TOKEN,
SPARSYNC_LOCAL_RANK, SPARSYNC_RANK, SPARSYNC_SIZE and PYTHONUNBUFFERED=1; the directory of the
Python running sparsyncrun is put first on the workers' PATH, so `python` is that Python.

Output lines are prefixed with [r] for worker rank r and [d<i>] for the daemon of node i. If any
process fails, the others are stopped (SIGTERM and SIGCONT, then SIGKILL after a grace period),
the first failure is reported and sparsyncrun exits non-zero (the failed worker's exit status
when it has one). When every worker exits 0 the daemons are stopped and sparsyncrun exits 0.
Ctrl-C, SIGTERM or SIGHUP stops every process it started, removes the temporary directory and
exits 128 + the signal's number (130, 143, 129). If sparsyncrun itself is killed with SIGKILL,
a small reaper process it started first stops what it had started and removes the directory.

The daemon binary is $SPARSYNC_DAEMON if set, else the one installed with this package or built
in this checkout (build/daemon/sparsyncd), else sparsyncd on PATH.
"""


class _Failure(Exception):
    pass


class _Interrupted(Exception):
    pass


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _describe_exit(rc):
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return "killed by signal %s" % signal.Signals(-rc).name
        except ValueError:
            return "killed by signal %d" % -rc
    return "exit status %d" % rc


class _Child:
    def __init__(self, label, kind, index, argv, env, out_lock, events):
        self.label, self.kind, self.index = label, kind, index
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True, close_fds=True)
        self._out_lock = out_lock
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()
        self.waiter = threading.Thread(target=self._wait, args=(events,), daemon=True)
        self.waiter.start()

    def _pump(self):
        prefix = ("[%s] " % self.label).encode()
        out = sys.stdout.buffer
        for line in iter(self.proc.stdout.readline, b""):
            if not line.endswith(b"\n"):
                line += b"\n"
            with self._out_lock:
                out.write(prefix + line)
                out.flush()
        self.proc.stdout.close()

    def _wait(self, events):
        rc = self.proc.wait()
        events.put((self, rc))

    def signal(self, sig, after_exit=False):
        """Signals the child's process group; with after_exit also once the child itself has
        ended, for what it started and left behind."""
        if self.proc.returncode is not None and not after_exit:
            return
        try:
            os.killpg(self.proc.pid, sig)  # the child and anything it started
        except (ProcessLookupError, PermissionError):
            pass

    def describe(self):
        who = "worker rank %d" % self.index if self.kind == "worker" else "daemon of node %d" \
            % self.index
        return "%s (pid %d)" % (who, self.proc.pid)


class Launcher:
    def __init__(self, np_, nodes, start_timeout_s, command, daemon):
        self.np, self.nodes, self.start_timeout_s = np_, nodes, start_timeout_s
        self.command, self.daemon = command, daemon
        self.events = queue.Queue()
        self.out_lock = threading.Lock()
        self.daemons, self.workers = [], []
        self.tmpdir = None
        self.reaper = None

    def _log(self, message):
        with self.out_lock:
            sys.stderr.write("sparsyncrun: %s\n" % message)
            sys.stderr.flush()

    def run(self):
        self.tmpdir = tempfile.mkdtemp(prefix="sparsyncrun-")
        os.chmod(self.tmpdir, 0o700)
        try:
            self._start_reaper()
            self._start_daemons()
            self._wait_for_sockets()
            self._start_workers()
            self._supervise()
            self._stop(self.daemons)
            return 0
        except _Failure as f:
            self._log(f.args[0])
            self._stop(self.workers + self.daemons)
            return f.args[1] if len(f.args) > 1 else 1
        except _Interrupted as e:
            self._log("%s: stopping every process" % e.args[0])
            self._stop(self.workers + self.daemons)
            return 128 + e.args[1]
        finally:
            self._stop(self.workers + self.daemons)
            for c in self.workers + self.daemons:
                c.reader.join(timeout=2.0)
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self._release_reaper()

    def _start_reaper(self):
        """The process that cleans up if this one is killed with SIGKILL (_reaper.py)."""
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_reaper.py")
        self.reaper = subprocess.Popen([sys.executable, script, self.tmpdir],
                                       stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                       start_new_session=True, close_fds=True)

    def _tell_reaper(self, line):
        try:
            self.reaper.stdin.write((line + "\n").encode())
            self.reaper.stdin.flush()
        except (OSError, ValueError):
            pass  # the reaper is gone: nothing more can be done for a SIGKILL

    def _release_reaper(self):
        if self.reaper is None:
            return
        self._tell_reaper("done")
        try:
            self.reaper.stdin.close()
        except OSError:
            pass
        try:
            self.reaper.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self.reaper.kill()
        self.reaper = None

    def _start_daemons(self):
        port = _free_port()
        token = secrets.token_hex(16)
        self.token = token
        local_size = self.np // self.nodes
        for i in range(self.nodes):
            env = dict(os.environ)
            env.update({
                "SPARSYNC_NODE_RANK": str(i), "SPARSYNC_NUM_NODES": str(self.nodes),
                "SPARSYNC_COORDINATOR": "127.0.0.1:%d" % port, "SPARSYNC_LISTEN": "127.0.0.1",
                "SPARSYNC_SOCKET": self._socket(i), "SPARSYNC_LOCAL_SIZE": str(local_size),
                "SPARSYNC_JOB_TOKEN": token,
            })
            with GATE.holding():  # started means recorded: an interrupt waits for both
                try:
                    self.daemons.append(_Child("d%d" % i, "daemon", i, [self.daemon], env,
                                               self.out_lock, self.events))
                except OSError as e:
                    raise _Failure("cannot start the daemon %s: %s" % (self.daemon, e))
                self._tell_reaper("pgid %d" % self.daemons[-1].proc.pid)

    def _socket(self, node):
        return os.path.join(self.tmpdir, "node%d.sock" % node)

    def _wait_for_sockets(self):
        deadline = time.monotonic() + self.start_timeout_s
        while not all(os.path.exists(self._socket(i)) for i in range(self.nodes)):
            try:
                child, rc = self.events.get(timeout=0.05)
                raise _Failure("%s ended during start-up (%s) before creating its socket"
                               % (child.describe(), _describe_exit(rc)), _exit_code(rc))
            except queue.Empty:
                pass
            if time.monotonic() > deadline:
                missing = [i for i in range(self.nodes) if not os.path.exists(self._socket(i))]
                raise _Failure("the daemons of nodes %s did not create their sockets within "
                               "%.0f s (--timeout-s): the cluster did not form"
                               % (missing, self.start_timeout_s))

    def _start_workers(self):
        local_size = self.np // self.nodes
        bindir = os.path.dirname(os.path.abspath(sys.executable))
        for r in range(self.np):
            env = dict(os.environ)
            env.update({
                "SPARSYNC_SOCKET": self._socket(r // local_size), "SPARSYNC_JOB_TOKEN": self.token,
                "SPARSYNC_LOCAL_RANK": str(r % local_size), "SPARSYNC_RANK": str(r),
                "SPARSYNC_SIZE": str(self.np), "PYTHONUNBUFFERED": "1",
                "PATH": bindir + os.pathsep + env.get("PATH", ""),
            })
            with GATE.holding():
                try:
                    self.workers.append(_Child(str(r), "worker", r, self.command, env,
                                               self.out_lock, self.events))
                except OSError as e:
                    raise _Failure("cannot start the command %r: %s" % (self.command[0], e),
                                   127)
                self._tell_reaper("pgid %d" % self.workers[-1].proc.pid)

    def _supervise(self):
        finished = 0
        while finished < len(self.workers):
            child, rc = self.events.get()
            if child.kind == "daemon":
                raise _Failure("%s failed first: it ended (%s) while workers were running"
                               % (child.describe(), _describe_exit(rc)), _exit_code(rc))
            if rc != 0:
                raise _Failure("%s failed first: %s" % (child.describe(), _describe_exit(rc)),
                               _exit_code(rc))
            finished += 1

    def _stop(self, children):
        alive = [c for c in children if c.proc.returncode is None]
        if not alive:
            return
        for c in alive:
            c.signal(signal.SIGTERM)
            c.signal(signal.SIGCONT)  # a stopped process handles its SIGTERM only once resumed
        deadline = time.monotonic() + _GRACE_S
        for c in alive:
            try:
                c.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for c in alive:
            if c.proc.returncode is None:
                self._log("%s did not stop within %.0f s of SIGTERM: SIGKILL"
                          % (c.describe(), _GRACE_S))
                c.signal(signal.SIGKILL)
                c.proc.wait()
            else:
                c.signal(signal.SIGKILL, after_exit=True)  # leftovers in its process group


def _exit_code(rc):
    if rc is None or rc == 0:
        return 1
    return rc if rc > 0 else 128 - rc


def parse_args(argv):
    p = argparse.ArgumentParser(prog="sparsyncrun", description=_DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-np", "--num-proc", dest="np", type=int, required=True, metavar="N",
                   help="number of worker processes (global ranks)")
    p.add_argument("--nodes", type=int, default=None, metavar="M",
                   help="number of simulated nodes, each with its own daemon; must divide N "
                        "(default: N, one worker per node)")
    p.add_argument("--timeout-s", type=float, default=60.0, metavar="S",
                   help="how long the daemons may take to form the cluster and create their "
                        "sockets before the job is abandoned (default: 60)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="CMD...",
                   help="the worker command and its arguments")
    _hosts.add_arguments(p)
    args = p.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        p.error("no command given")
    if args.np < 1:
        p.error("-np must be at least 1")
    args.placed = _hosts.check_arguments(p, args)  # None: simulated nodes on this machine
    if args.nodes is None:
        args.nodes = args.np
    if args.nodes < 1 or args.np % args.nodes != 0:
        p.error("-np %d workers cannot be split evenly over --nodes %d: N must be a multiple of M"
                % (args.np, args.nodes))
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    daemon = find_daemon()
    if daemon is None or not os.access(daemon, os.X_OK):
        sys.stderr.write("sparsyncrun: sparsyncd not found%s: set SPARSYNC_DAEMON to its path or "
                         "build the project (cmake -S . -B build -G Ninja && cmake --build build)\n"
                         % (" at %s" % daemon if daemon else ""))
        return 127
    if args.placed:
        launcher = _hosts.MultiHostLauncher(args, args.placed, daemon, _Failure, _Interrupted)
    else:
        launcher = Launcher(args.np, args.nodes, args.timeout_s, args.command, daemon)

    interrupted = []

    def on_signal(signum, frame):
        if interrupted:
            return  # already stopping; a second Ctrl-C must not cut the clean-up short
        interrupted.append(signum)
        GATE.interrupt(_Interrupted("received %s" % signal.Signals(signum).name, int(signum)))

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    return launcher.run()


if __name__ == "__main__":
    sys.exit(main())
else:
    from sparsync import _run_api

    _run_api.make_callable(sys.modules[__name__])  # sparsync.run(func, np=...)
