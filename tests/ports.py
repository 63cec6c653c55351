"""TCP ports for the servers the tests start, that no other test run on this machine hands out at the same time.

tools/test.sh runs its two pytest passes at once, and a port picked the usual way (bind port 0, read it, close
the socket, pass the number to a server) is free only "a moment ago": until the server binds it, another run's
bind(0) may pick the same number, and any client's outgoing connection may take it as its local port (both come
from the kernel's ephemeral range). So each test process claims a block of ports below the ephemeral range, held
with an flock on a file in the temp directory for as long as the process lives, and hands out its block's ports
in turn (each one checked bindable first). Where no block can be claimed, it falls back to bind(0).
"""

from __future__ import annotations

import fcntl
import os
import socket
import tempfile
from typing import IO

FIRST = 10000  # above the well-known and registered ports most local services use
BLOCK = 4000  # ports per test process; used in turn, so a port comes back only after the other 3999

_lock: IO[bytes] | None = None  # the claimed block's lock file, open (and locked) until this process exits
_block: range | None = None
_claimed = False  # a claim was tried (it fails where every block is held: then bind(0) as before)
_next = 0
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default range starts here


def _claim_block() -> range | None:
    global _lock
    for start in range(FIRST, _ephemeral_low() - BLOCK + 1, BLOCK):
        f = open(os.path.join(tempfile.gettempdir(), f"trireme-test-ports-{start}.lock"), "a+b")  # noqa: SIM115
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another test process holds this block
            f.close()
            continue
        _lock = f
        return range(start, start + BLOCK)
    return None


def _bindable(port: int) -> bool:
    """Nothing is bound to 127.0.0.1:port (no SO_REUSEADDR: a port with connections in TIME_WAIT is passed over)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _kernel_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, not handed out before in this test process (until its block wraps
    around: a server takes several ports picked one after another) and not handed out by another test process."""
    global _block, _claimed, _next
    if not _claimed:
        _claimed = True
        _block = _claim_block()
    if _block is None:
        while (port := _kernel_port()) in _handed_out:
            pass
        _handed_out.add(port)
        return port
    for _ in range(len(_block)):
        port = _block[_next]
        _next = (_next + 1) % len(_block)
        if _bindable(port):
            return port
    raise RuntimeError(f"no free port in {_block.start}-{_block.stop - 1}")
