"""The peers the cluster harness runs beside sparsync, in the same namespaces on the same profiles.

  ddp           torch.distributed DistributedDataParallel, gloo (ddp_worker.py)
  ddp_powersgd  the same with PyTorch's PowerSGD communication hook, rank --powersgd-rank (4)
  hvd_dense     Horovod's DistributedOptimizer, Gloo, its fusion defaults (horovod_worker.py)
  hvd_fp16      the same with hvd.Compression.fp16
  hvd_topk      TopK-SGD over Horovod's allgather, as the OMGS-SGD authors ran it

The torch.distributed peers run under the harness's --python (Debian's torch); the Horovod ones
under --peer-python, the environment bench/peers/setup.sh makes. Horovod's processes get the
variables `horovodrun --gloo` would give them (hvd_rendezvous.py explains why the harness
launches them itself). Dilated timers keep their modelled values: Horovod's cycle time
(HOROVOD_CYCLE_TIME, 1 ms by default) and its Gloo time-out are multiplied by the dilation.
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent
MODES = ["ddp", "ddp_powersgd", "hvd_dense", "hvd_fp16", "hvd_topk"]
HOROVOD = {"hvd_dense": "dense", "hvd_fp16": "fp16", "hvd_topk": "topk"}
HOROVOD_CYCLE_MS = 1.0  # Horovod 0.28's default (horovod/common/operations.cc)


def is_horovod(mode):
    return mode in HOROVOD


def hosts(nodes):
    """horovodrun's -H for one slot per namespace."""
    return ",".join("n%d:1" % i for i in range(nodes))


def rendezvous_argv(python, nodes, port, ready):
    return [python, str(HERE / "hvd_rendezvous.py"), "--hosts", hosts(nodes), "--port",
            str(port), "--ready", str(ready)]


def horovod_env(net, i, nodes, port, dilation, timeout_s):
    """The variables of node i's process, as horovod.runner.gloo_run sets them for one slot per
    host, plus the dilated timers."""
    return {"HOROVOD_GLOO_RENDEZVOUS_ADDR": net.address(0),
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port), "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_IFACE": net.node_if(i),
            "HOROVOD_HOSTNAME": "n%d" % i, "HOROVOD_RANK": str(i), "HOROVOD_SIZE": str(nodes),
            "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "1", "HOROVOD_CROSS_RANK": str(i),
            "HOROVOD_CROSS_SIZE": str(nodes),
            "HOROVOD_CYCLE_TIME": "%g" % dilation.wall(HOROVOD_CYCLE_MS),
            "HOROVOD_GLOO_TIMEOUT_SECONDS": str(int(dilation.wall(timeout_s)))}


def horovod_worker_argv(python, mode, density, select_cost=0.0):
    """select_cost: wall seconds per n log2 n (times D) that hvd_topk's selection is padded to."""
    argv = [python, str(HERE / "horovod_worker.py"), "--mode", HOROVOD[mode],
            "--density", str(density)]
    return argv + (["--select-cost", "%g" % select_cost] if mode == "hvd_topk" and select_cost
                   else [])


def ddp_env(net, i, nodes, port):
    return {"MASTER_ADDR": net.address(0), "MASTER_PORT": str(port), "RANK": str(i),
            "WORLD_SIZE": str(nodes), "GLOO_SOCKET_IFNAME": net.node_if(i)}


def ddp_worker_argv(python, mode, powersgd_rank, timeout_s):
    argv = [python, str(HERE / "ddp_worker.py"), "--timeout-s", str(int(timeout_s))]
    return argv + (["--powersgd-rank", str(powersgd_rank)] if mode == "ddp_powersgd" else [])
