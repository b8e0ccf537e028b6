"""Running the harness's commands: foreground steps, background processes, and --dry-run.

`Runner` is the one place that executes anything. Every command line is appended to a log (and
printed with --verbose); with dry_run it is only printed, on stdout, exactly as it would run.
Background processes get their own session (process group), so that stopping one stops what it
started, and the highest OOM score, so that a run too big for the machine's memory fails itself
rather than another job; `stop_all` is safe to call at any time, also from a signal-driven
clean-up.
"""

import os
import shlex
import signal
import subprocess
import sys
import time

GRACE_S = 10.0


def _first_for_the_oom_killer():
    """In a started process, before exec: if memory runs out, the kernel kills the benchmark's
    processes before anyone else's on this shared machine (a run then fails as such)."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


def env_argv(env):
    """`env K=V ...`: environment given on the command line, so that printed == executed."""
    return ["env"] + ["%s=%s" % kv for kv in env.items()]


class Background:
    def __init__(self, label, proc, log_path):
        self.label, self.proc, self.log_path = label, proc, log_path

    def poll(self):
        return self.proc.poll() if self.proc else 0

    def signal(self, sig):
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def log_tail(self, chars=3000):
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - chars))
                return f.read().decode(errors="replace")
        except (OSError, TypeError):
            return ""


class Runner:
    def __init__(self, dry_run, verbose=False, log_path=None, base_env=None):
        self.dry_run, self.verbose = dry_run, verbose
        self.log_path = log_path
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.background = []

    def note(self, text):
        """A comment in the command stream (the dry run's narration)."""
        self._record("# " + text)

    def _record(self, line):
        if self.dry_run or self.verbose:
            print(line, flush=True)
        if self.log_path and not self.dry_run:
            with open(self.log_path, "a") as f:
                f.write(line + "\n")

    def run(self, argv, check=True, capture=False, timeout_s=60):
        """Runs a foreground command; returns its CompletedProcess (None in a dry run)."""
        self._record(shlex.join(argv))
        if self.dry_run:
            return None
        r = subprocess.run(argv, env=self.base_env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, timeout=timeout_s)
        if check and r.returncode != 0:
            raise RuntimeError("command failed (exit %d): %s\n%s"
                               % (r.returncode, shlex.join(argv), r.stderr.strip()))
        return r

    def write_file(self, path, text):
        """Writes a small file (creating its folder); noted in the command stream."""
        self._record("# write %s: %r" % (path, text))
        if not self.dry_run:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)

    def start(self, label, argv, log_path):
        """Starts a background process writing stdout and stderr to log_path."""
        self._record(shlex.join(argv) + " > %s 2>&1 &" % shlex.quote(str(log_path)))
        if self.dry_run:
            b = Background(label, None, log_path)
        else:
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(argv, env=self.base_env, stdin=subprocess.DEVNULL,
                                        stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True, close_fds=True,
                                        preexec_fn=_first_for_the_oom_killer)
            b = Background(label, proc, log_path)
        self.background.append(b)
        return b

    def stop(self, procs, grace_s=GRACE_S):
        """SIGTERM, then SIGKILL after the grace period; returns the labels that needed it."""
        alive = [p for p in procs if p.proc is not None and p.proc.poll() is None]
        for p in alive:
            p.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        killed = []
        for p in alive:
            try:
                p.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                killed.append(p.label)
                p.signal(signal.SIGKILL)
                p.proc.wait()
        self.background = [b for b in self.background if b not in procs]
        return killed

    def stop_all(self):
        return self.stop(list(self.background), grace_s=3.0)


def wait_for_files(paths, procs, timeout_s, dry_run, what="files"):
    """Waits until every path exists; a process of `procs` exiting first, or the timeout, raises
    RuntimeError with its log tail."""
    if dry_run:
        return
    deadline = time.monotonic() + timeout_s
    while not all(os.path.exists(p) for p in paths):
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError("%s exited (%s) during start-up:\n%s"
                                   % (p.label, p.poll(), p.log_tail()))
        if time.monotonic() > deadline:
            raise RuntimeError("%s did not appear within %.0f s" % (what, timeout_s))
        time.sleep(0.05)


def wait_all(procs, timeout_s, watch=()):
    """Waits for every process in `procs` to exit 0; a failure, a watched process exiting, or
    the timeout raises RuntimeError with the log tail of the culprit."""
    deadline = time.monotonic() + timeout_s
    while True:
        pending = False
        for p in procs:
            rc = p.poll()
            if rc is None:
                pending = True
            elif rc != 0:
                raise RuntimeError("%s exited with %s:\n%s" % (p.label, rc, p.log_tail()))
        if not pending:
            return
        for w in watch:
            if w.poll() is not None:
                raise RuntimeError("%s exited (%s) while workers ran:\n%s"
                                   % (w.label, w.poll(), w.log_tail()))
        if time.monotonic() > deadline:
            raise RuntimeError("workers still running after %.0f s (--run-timeout-s)"
                               % timeout_s)
        time.sleep(0.2)


def warn(message):
    sys.stderr.write("harness: %s\n" % message)
    sys.stderr.flush()
