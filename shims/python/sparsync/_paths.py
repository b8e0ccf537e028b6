"""Where the daemon binary, the client library and the default control socket are."""

import os
import shutil
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent
# shims/python/sparsync/_paths.py -> the repository root of a development checkout.
_REPO_ROOT = _PACKAGE_DIR.parents[2]


def _dev_checkout():
    if (_REPO_ROOT / "proto" / "intake" / "wire.h").is_file():
        return _REPO_ROOT
    return None


def _first_existing(candidates):
    for c in candidates:
        if c is not None and Path(c).is_file():
            return str(c)
    return None


def find_daemon():
    """Path of sparsyncd: $SPARSYNC_DAEMON, the package dir, the dev build, then $PATH."""
    env = os.environ.get("SPARSYNC_DAEMON")
    if env:
        return env
    repo = _dev_checkout()
    return _first_existing([
        _PACKAGE_DIR / "bin" / "sparsyncd",
        _PACKAGE_DIR / "sparsyncd",
        repo / "build" / "daemon" / "sparsyncd" if repo else None,
        shutil.which("sparsyncd"),
    ])


def find_client_library():
    """Path of libsparsync_client.so: $SPARSYNC_CLIENT_LIB, the package dir, the dev build."""
    env = os.environ.get("SPARSYNC_CLIENT_LIB")
    if env:
        return env
    repo = _dev_checkout()
    name = "libsparsync_client.so"
    return _first_existing([
        _PACKAGE_DIR / "lib" / name,
        _PACKAGE_DIR / name,
        repo / "build" / "shims" / "client" / name if repo else None,
        repo / "build-client" / name if repo else None,  # standalone build of shims/client
    ])


def default_socket_path():
    """The daemon's default: $XDG_RUNTIME_DIR/sparsync/sparsyncd.sock, else /tmp/sparsync-<uid>/."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "sparsync", "sparsyncd.sock")
    return os.path.join("/tmp", "sparsync-%d" % os.getuid(), "sparsyncd.sock")
