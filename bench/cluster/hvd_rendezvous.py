"""The rendezvous server of a Horovod Gloo job, for the cluster harness's Horovod peers.

`horovodrun --gloo` starts Horovod's HTTP rendezvous server, allocates one slot per process and
runs each process with HOROVOD_* variables naming its slot and the server; the processes' Gloo
contexts meet there. horovodrun reaches other hosts only over ssh, which the emulated cluster's
network namespaces do not have, so the harness does the launcher's part itself: this script runs
the same server (Horovod's own RendezvousHTTPServer with the plan of
horovod.runner.common.util.hosts) on a fixed port, and the harness starts the workers in their
namespaces with the variables horovodrun would give them (harness.py, peer_env).

    hvd_rendezvous.py --hosts n0:1,n1:1 --port 29600 --ready /tmp/run/rdv.ready

Serves until SIGTERM. Run with the peers' Python (bench/peers/setup.sh).
"""

import argparse
import signal
import sys
from pathlib import Path

from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", required=True, help="host:slots,... as horovodrun -H takes it")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--bind", default="", help="address to bind (default: all)")
    p.add_argument("--ready", default="", help="file created once the server listens")
    args = p.parse_args(argv)
    hosts = parse_hosts(args.hosts)
    plan = get_host_assignments(hosts, sum(h.slots for h in hosts))
    server = RendezvousHTTPServer((args.bind, args.port), RendezvousHandler, 0)
    server.init(plan)

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    if args.ready:
        Path(args.ready).write_text("%d\n" % args.port)
    print("rendezvous: %d slots on %s, port %d" % (len(plan), args.hosts, args.port), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
