"""sparsync.run(func, np=...): horovod.run for scripts that launch themselves."""

import subprocess
import sys

from conftest import WORKERS, sparsync_env


def run_script(daemon, *args):
    env = sparsync_env({"SPARSYNC_DAEMON": daemon, "SPARSYNC_COMPRESSOR": "none"})
    return subprocess.run([sys.executable, str(WORKERS / "run_api.py")] + list(args), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=180)


def test_run_returns_results_in_rank_order(daemon):
    out = run_script(daemon)
    assert out.returncode == 0, out.stdout
    want = [{"rank": r, "size": 3, "value": 103.0} for r in range(3)]
    assert "RESULTS %s" % want in out.stdout, out.stdout


def test_run_reports_a_failed_worker(daemon):
    out = run_script(daemon, "fail")
    assert out.returncode == 0, out.stdout
    assert "RUNERROR sparsync.run: the job of 3 workers failed" in out.stdout, out.stdout
    assert "rank 1 fails on purpose" in out.stdout, out.stdout
