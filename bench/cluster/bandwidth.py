"""A TCP throughput probe for checking the emulated cluster's link shaping.

    bandwidth.py recv --bind 198.18.0.2 --port 5201     # prints {"bytes", "seconds", "gbps"}
    bandwidth.py send --to 198.18.0.2:5201 --seconds 3

The receiver accepts one connection, reads until the sender closes it and reports the rate over
the span from the first to the last byte received. harness.py --measure-bandwidth runs the pair
across two namespaces (ip netns exec) in both directions.
"""

import argparse
import json
import socket
import sys
import time

_CHUNK = 1 << 20


def receive(bind, port, timeout_s):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((bind, port))
        srv.listen(1)
        srv.settimeout(timeout_s)
        conn, peer = srv.accept()
        with conn:
            conn.settimeout(timeout_s)
            buf = bytearray(_CHUNK)
            total, first, last = 0, None, None
            while True:
                n = conn.recv_into(buf)
                if n == 0:
                    break
                last = time.perf_counter()
                if first is None:
                    first = last
                total += n
    seconds = (last - first) if first is not None else 0.0
    gbps = total * 8 / seconds / 1e9 if seconds > 0 else 0.0
    return {"from": peer[0], "to": bind, "bytes": total, "seconds": round(seconds, 4),
            "gbps": round(gbps, 4)}


def send(host, port, seconds, connect_timeout_s):
    deadline = time.monotonic() + connect_timeout_s
    while True:
        try:
            s = socket.create_connection((host, port), timeout=connect_timeout_s)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    payload = b"\0" * _CHUNK
    with s:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        s.recv(1)  # wait for the receiver to close: everything sent has been read


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("recv")
    r.add_argument("--bind", required=True)
    r.add_argument("--port", type=int, default=5201)
    r.add_argument("--timeout-s", type=float, default=30.0)
    s = sub.add_parser("send")
    s.add_argument("--to", required=True, help="host:port")
    s.add_argument("--seconds", type=float, default=3.0)
    s.add_argument("--connect-timeout-s", type=float, default=10.0)
    args = p.parse_args(argv)
    if args.cmd == "recv":
        print(json.dumps(receive(args.bind, args.port, args.timeout_s)), flush=True)
    else:
        host, port = args.to.rsplit(":", 1)
        send(host, int(port), args.seconds, args.connect_timeout_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
