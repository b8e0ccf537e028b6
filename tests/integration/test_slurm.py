"""sparsync under Slurm, for real: Debian's slurmctld and two slurmd (slurm_cluster.py) with
munge, started here and stopped after the module. deploy/slurm/train.sbatch runs the daemons as
one step (one task per node: they take node rank, node count and coordinator from SLURM_*) and
the workers as another (one or K tasks per node: they take local rank, rank and size from
SLURM_*); the results are checked on every rank.
"""

import re
import sys

import pytest

from conftest import REPO, daemon_path, sparsync_env

SBATCH = REPO / "deploy" / "slurm" / "train.sbatch"

WORKER = """
import os, torch, sparsync.torch as hvd
hvd.init()
s = hvd.allreduce(torch.full((4096,), float(hvd.rank() + 1)), average=False, name="s")
print("rank %d of %d local %d node %d on %s sum %g" % (hvd.rank(), hvd.size(), hvd.local_rank(),
      hvd.cross_rank(), os.environ["SLURMD_NODENAME"], s[0].item()), flush=True)
hvd.shutdown()
"""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory, daemon):
    from hostnet import can_make_namespaces
    from slurm_cluster import SlurmCluster, missing_tools
    why = can_make_namespaces() or (missing_tools() and "needs %s (deploy/install_deps.sh: "
                                    "slurm-wlm, munge)" % missing_tools())
    if why:
        pytest.skip(why)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def sbatch(slurm, tmp_path, ntasks_per_node, command, extra=None):
    out = tmp_path / "job.out"
    env = sparsync_env({"SPARSYNC_COMPRESSOR": "none", "SPARSYNC_CALIBRATE": "0",
                        "SPARSYNC_DAEMON": daemon_path(), **(extra or {})})
    r = slurm.client(["sbatch", "--wait", "--nodes=2", "--ntasks-per-node=%d" % ntasks_per_node,
                      "--output=%s" % out, "--chdir=%s" % tmp_path, str(SBATCH)] + command,
                     env=env, check=False, timeout=180)
    text = out.read_text(errors="replace") if out.exists() else ""
    return r, text


@pytest.mark.parametrize("per_node", [1, 2])
def test_sbatch_runs_the_daemons_and_the_workers_from_slurms_variables(slurm, tmp_path,
                                                                        per_node):
    r, out = sbatch(slurm, tmp_path, per_node, [sys.executable, "-c", WORKER])
    assert r.returncode == 0, "%s\n%s\n%s\n%s" % (r.stdout, r.stderr, out, slurm.logs())
    size = 2 * per_node
    total = size * (size + 1) // 2
    for rank in range(size):
        node = rank // per_node
        assert re.search(r"rank %d of %d local %d node %d on sn%d sum %d\b"
                         % (rank, size, rank % per_node, node, node, total), out), out
    # The daemons were placed by Slurm: node 1's daemon found node 0 (sn0) as its coordinator,
    # at 29400 + job id % 1000, and listened on its own node name.
    job = int(re.search(r"Submitted batch job (\d+)", r.stdout).group(1))
    assert "coordinator sn0:%d" % (29400 + job % 1000) in out, out
    assert "node 1/2" in out and "listen sn1" in out, out
    # At the end the daemons were stopped with SIGTERM, not killed.
    assert out.count("received SIGTERM, shutting down") == 2, out
    assert "Killed" not in out, out


def test_a_failing_worker_fails_the_batch_job(slurm, tmp_path):
    code = ("import sys, sparsync.torch as hvd\nhvd.init()\n"
            "sys.exit(3 if hvd.rank() == 1 else 0)\n")
    r, out = sbatch(slurm, tmp_path, 1, [sys.executable, "-c", code])
    assert r.returncode != 0, out
