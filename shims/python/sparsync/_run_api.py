"""``sparsync.run(func, np=...)``: Horovod's ``horovod.run`` for scripts that launch themselves.

``import sparsync as horovod; horovod.run(train, np=4)`` starts a job with sparsyncrun (its
daemons and `np` workers), calls ``func(*args, **kwargs)`` on every worker and returns the list of
results in rank order. `func` travels pickled: with cloudpickle when it is installed (lambdas,
closures), else by reference; a function of the launching script is found because each worker
first runs that script under the name ``__mp_main__`` (as multiprocessing's spawn does), so the
script's work must sit under ``if __name__ == "__main__":``.

``sparsync.run`` stays the launcher's module as well (``sparsync.run.main`` is sparsyncrun): the
module is made callable rather than replaced.
"""

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import types

try:
    import cloudpickle as _pickler
except ImportError:  # plain pickle: functions by reference
    _pickler = pickle


class RunError(RuntimeError):
    """The job started by sparsync.run failed; the message names the exit status."""


def run(func, args=(), kwargs=None, np=1, hosts=None, hostfile=None, nodes=None,
        start_timeout=None, executable=None, env=None, **ignored_horovod_options):
    """Runs ``func(*args, **kwargs)`` on `np` workers (sparsyncrun -np np; `nodes` simulated
    nodes, default one per worker; or `hosts` "h1:2,h2:2" / `hostfile` over OpenSSH) and returns
    their results in rank order. Horovod's other options (use_gloo, verbose, ...) are accepted
    and have no effect; ``min_np``/``max_np`` (elastic) are refused."""
    if ignored_horovod_options.get("min_np") or ignored_horovod_options.get("max_np"):
        from sparsync._torch_elastic import ElasticNotSupportedError, _MESSAGE

        raise ElasticNotSupportedError(_MESSAGE)
    if not callable(func):
        raise TypeError("sparsync.run needs a callable, got %r" % (func,))
    if int(np) < 1:
        raise ValueError("np must be at least 1, got %r" % (np,))
    work = tempfile.mkdtemp(prefix="sparsync-run-")
    try:
        main = sys.modules.get("__main__")
        main_path = getattr(main, "__file__", None)
        with open(os.path.join(work, "func.pkl"), "wb") as f:
            pickle.dump({"main": os.path.abspath(main_path) if main_path else None,
                         "payload": _pickler.dumps((func, tuple(args), dict(kwargs or {})))}, f)
        python = executable or sys.executable
        # -c rather than -m: the package's __init__ has already imported both modules.
        argv = [python, "-c", "import sys; from sparsync.run import main; sys.exit(main())",
                "-np", str(int(np))]
        if nodes is not None:
            argv += ["--nodes", str(int(nodes))]
        if hosts:
            argv += ["-H", hosts]
        if hostfile:
            argv += ["--hostfile", hostfile]
        if start_timeout is not None:
            argv += ["--timeout-s", str(float(start_timeout))]
        argv += ["--", python, "-c",
                 "import sys; from sparsync._run_api import _worker; _worker(sys.argv[1])", work]
        child_env = dict(os.environ if env is None else env)
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        child_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root, child_env.get("PYTHONPATH", "")) if p)
        rc = subprocess.call(argv, env=child_env)
        if rc != 0:
            raise RunError("sparsync.run: the job of %d workers failed (sparsyncrun exit status "
                           "%d; its output above names the cause)" % (int(np), rc))
        results = []
        for r in range(int(np)):
            with open(os.path.join(work, "result.%d.pkl" % r), "rb") as f:
                results.append(pickle.load(f))
        return results
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _load_main(path):
    """Runs the launching script as __mp_main__ and makes it __main__ for unpickling."""
    module = types.ModuleType("__mp_main__")
    module.__file__ = path
    sys.modules["__mp_main__"] = module
    sys.path.insert(0, os.path.dirname(path))
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec")
    exec(code, module.__dict__)
    sys.modules["__main__"] = module


def _worker(work):
    with open(os.path.join(work, "func.pkl"), "rb") as f:
        spec = pickle.load(f)
    if spec["main"]:
        _load_main(spec["main"])
    func, args, kwargs = pickle.loads(spec["payload"])
    result = func(*args, **kwargs)
    rank = int(os.environ.get("SPARSYNC_RANK", "0"))
    tmp = os.path.join(work, "result.%d.pkl.tmp" % rank)
    with open(tmp, "wb") as f:
        _pickler.dump(result, f)
    os.rename(tmp, os.path.join(work, "result.%d.pkl" % rank))


class _CallableModule(types.ModuleType):
    """The class given to the sparsync.run module: calling it is run()."""

    def __call__(self, *args, **kwargs):
        return run(*args, **kwargs)


def make_callable(module):
    module.__class__ = _CallableModule
