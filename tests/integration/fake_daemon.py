#!/usr/bin/env python3
"""A single-node stand-in for sparsyncd that speaks the intake protocol (proto/intake/wire.h,
in the shim's Python copy sparsync/_wire.py).

Used to test the client library, the Python shim and the launcher independently of the real
daemon, and to send what the real daemon never should (malformed messages, abrupt closes).
Configured like sparsyncd: SPARSYNC_SOCKET, SPARSYNC_LOCAL_SIZE, SPARSYNC_JOB_TOKEN,
SPARSYNC_NUM_NODES must be 1. FAKE_DAEMON_MODE selects misbehaviour:
  normal | garbage-on-ready | close-on-ready | wrong-round-on-ready
"""

import mmap
import os
import selectors
import signal
import socket
import sys
from pathlib import Path

import numpy as np

# The wire format as the shim has it (sparsync/_wire.py), also when run outside pytest.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "shims" / "python"))
from sparsync import _wire as W

NP = {W.FLOAT32: np.float32, W.FLOAT64: np.float64, W.FLOAT16: np.float16, W.INT32: np.int32,
      W.INT64: np.int64, W.UINT8: np.uint8}
ITEM = W.ITEMSIZE


def done(tid, status, rnd, message=b"", result_bytes=0, dim0=0):
    return W.DONE.pack(tid, status, rnd, result_bytes, dim0, message[:W.MAX_ERROR_BYTES - 1])


class Worker:
    def __init__(self, conn):
        self.conn, self.local_rank, self.pid, self.hello = conn, None, 0, False
        self.tensors = {}  # id -> dict(name, op, dtype, reduce, shape, root, mm)
        self.goodbye = False


class FakeDaemon:
    def __init__(self):
        self.path = os.environ["SPARSYNC_SOCKET"]
        self.local_size = int(os.environ.get("SPARSYNC_LOCAL_SIZE", "1"))
        self.token = os.environ.get("SPARSYNC_JOB_TOKEN", "").encode()
        self.mode = os.environ.get("FAKE_DAEMON_MODE", "normal")
        self.sel = selectors.DefaultSelector()
        self.workers = []
        self.ready = {}  # name -> {worker: (tid, round)}
        self.failed = None

    def serve(self):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        if os.path.exists(self.path):
            os.unlink(self.path)
        self.lsock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.lsock.bind(self.path)
        self.lsock.listen(64)
        self.sel.register(self.lsock, selectors.EVENT_READ, None)
        print("fake daemon listening on %s" % self.path, flush=True)
        while True:
            for key, _ in self.sel.select():
                if key.data is None:
                    conn, _ = self.lsock.accept()
                    w = Worker(conn)
                    self.workers.append(w)
                    self.sel.register(conn, selectors.EVENT_READ, w)
                else:
                    self.on_readable(key.data)

    def stop(self, *_):
        try:
            os.unlink(self.path)
        except OSError:
            pass
        sys.exit(0)

    def drop(self, w, reason):
        self.sel.unregister(w.conn)
        w.conn.close()
        self.workers.remove(w)
        if not w.goodbye and self.failed is None:
            self.failed = "worker local rank %s (pid %d) disconnected: %s" % (
                w.local_rank, w.pid, reason)
            print("fake daemon: " + self.failed, flush=True)
            for name, posted in self.ready.items():
                for other, (tid, rnd) in posted.items():
                    if other is not w:
                        other.conn.send(done(tid, W.ERR_ABORTED, rnd, self.failed.encode()))
            self.ready.clear()

    def on_readable(self, w):
        try:
            data = w.conn.recv(4096)
        except ConnectionResetError:
            data = b""
        if not data:
            return self.drop(w, "connection closed without GOODBYE")
        mtype = W.HEADER.struct.unpack_from(data)[2]
        if mtype == W.MSG_HELLO:
            lr, pid, tlen, _, token = W.HELLO.unpack(data)
            w.local_rank, w.pid = lr, pid
            status, text = W.OK, b""
            if token[:tlen] != self.token:
                status, text = W.ERR_PERMISSION, b"wrong job token"
            w.conn.send(W.HELLO_REPLY.pack(status, 0, 1, lr, self.local_size, lr,
                                           self.local_size, 0, text))
        elif mtype == W.MSG_REGISTER:
            # f[7:9]: compressor, memory (host only here); f[9]: density; then the CUDA fields
            f = W.REGISTER.unpack(data)
            tid, op, dtype, red, ndim, root, nlen = f[:7]
            shape = tuple(f[10:10 + ndim])
            name = f[18][:nlen].decode()
            nbytes = int(np.prod(shape, dtype=np.int64)) * ITEM[dtype]
            fd = os.memfd_create("fake." + name)
            os.ftruncate(fd, max(nbytes, 1))
            mm = mmap.mmap(fd, max(nbytes, 1))
            w.tensors[tid] = dict(name=name, op=op, dtype=dtype, reduce=red, shape=shape,
                                  root=root, mm=mm, nbytes=nbytes)
            reply = W.REGISTER_REPLY.pack(tid, W.OK, nbytes, b"", b"")
            socket.send_fds(w.conn, [reply], [fd])
            os.close(fd)
        elif mtype == W.MSG_READY:
            tid, _, rnd, _ = W.READY.unpack(data)
            if self.mode == "garbage-on-ready":
                return w.conn.send(b"\x00" * 7)
            if self.mode == "close-on-ready":
                return self.drop(w, "fake daemon closes on READY")
            if self.mode == "wrong-round-on-ready":
                return w.conn.send(done(tid, W.OK, rnd + 5))
            if self.failed:
                return w.conn.send(done(tid, W.ERR_ABORTED, rnd, self.failed.encode()))
            t = w.tensors[tid]
            posted = self.ready.setdefault(t["name"], {})
            posted[w] = (tid, rnd)
            if len(posted) == self.local_size:
                del self.ready[t["name"]]
                self.complete(t["name"], posted)
        elif mtype == W.MSG_UNREGISTER:
            (tid, _) = W.UNREGISTER.unpack(data)
            w.tensors.pop(tid)["mm"].close()
        elif mtype == W.MSG_GOODBYE:
            w.goodbye = True

    def complete(self, name, posted):
        items = sorted(posted.items(), key=lambda kv: kv[0].local_rank)
        specs = [w.tensors[tid] for w, (tid, _) in items]
        first = specs[0]
        gather = first["op"] == W.OP_ALLGATHER

        def agreed(s):  # what every worker must agree on (an allgather's dim 0 may differ)
            return s["shape"][1:] if gather else s["shape"], s["dtype"]

        for w, s in zip([w for w, _ in items], specs):
            if agreed(s) != agreed(first):
                text = ("tensor '%s' has shape %s on local rank %d but %s on local rank %d"
                        % (name, list(first["shape"]), items[0][0].local_rank, list(s["shape"]),
                           w.local_rank)).encode()
                for w2, (tid, rnd) in items:
                    w2.conn.send(done(tid, W.ERR_MISMATCH, rnd, text))
                return
        dt = NP.get(first["dtype"], np.uint16)

        def arr(s):
            return np.frombuffer(s["mm"], dtype=dt, count=s["nbytes"] // ITEM[s["dtype"]])

        op = first["op"]
        if op == W.OP_ALLGATHER:
            out = b"".join(bytes(s["mm"][:s["nbytes"]]) for s in specs)
            dim0 = sum(s["shape"][0] if s["shape"] else 1 for s in specs)
            for w, (tid, rnd) in items:
                fd = os.memfd_create("fake.gather")
                os.write(fd, out if out else b"\0")
                socket.send_fds(w.conn, [done(tid, W.OK, rnd, b"", len(out), dim0)], [fd])
                os.close(fd)
            return
        if op == W.OP_BROADCAST:
            src = bytes(specs[first["root"]]["mm"][:first["nbytes"]])
            for s in specs:
                s["mm"][:first["nbytes"]] = src
        else:
            acc = np.zeros(first["nbytes"] // ITEM[first["dtype"]], dtype=np.float64
                           if first["dtype"] == W.FLOAT64
                           else np.float32 if first["dtype"] in (W.FLOAT32, W.FLOAT16)
                           else np.int64)
            for s in specs:
                acc += arr(s)
            if first["reduce"] == W.REDUCE_AVERAGE:
                acc = acc / len(specs)
            res = acc.astype(dt).tobytes()
            for s in specs:
                s["mm"][:first["nbytes"]] = res
        for w, (tid, rnd) in items:
            w.conn.send(done(tid, W.OK, rnd))


if __name__ == "__main__":
    d = FakeDaemon()
    signal.signal(signal.SIGTERM, d.stop)
    signal.signal(signal.SIGINT, d.stop)
    d.serve()
