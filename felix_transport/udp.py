"""UDP segmentation offload for the datagram loop (Linux GSO on send, GRO on receive).

One ``sendto`` per datagram was the largest single cost of the broker's busy time
(docs/performance.md). With UDP GSO one ``sendmsg`` carries several datagrams to
one address: every segment but the last has the same size (the last may be
smaller), at most :data:`MAX_SEGMENTS` of them and :data:`MAX_GSO_BYTES` in all;
the kernel splits them (loopback included).

With UDP GRO the kernel may hand one ``recvmsg`` several datagrams of one sender
glued together, with the segment size in a control message; :func:`split_gro` cuts
them apart again.

Support is probed once per socket (``setsockopt``); a send the kernel refuses with
an error that means "no GSO here" turns GSO off for that socket and the datagrams
go out one by one, as before.
"""

from __future__ import annotations

import errno
import socket
import struct
import sys
from collections.abc import Sequence

from .backends import Address

__all__ = [
    "GSO_REFUSED",
    "MAX_GSO_BYTES",
    "MAX_SEGMENTS",
    "SOL_UDP",
    "UDP_GRO",
    "UDP_SEGMENT",
    "enable_gro",
    "gro_cmsg_space",
    "gso_runs",
    "gso_supported",
    "send_gso",
    "split_gro",
]

# Linux include/uapi/linux/udp.h (Python's socket module names them from 3.12 on
# some builds only).
UDP_SEGMENT = 103
UDP_GRO = 104
SOL_UDP = getattr(socket, "SOL_UDP", 17)
# UDP_MAX_SEGMENTS of kernels 4.18-6.x (newer ones allow 128).
MAX_SEGMENTS = 64
# The largest UDP payload over IPv4 (65535 - 20 IP - 8 UDP); IPv6 allows 20 more.
MAX_GSO_BYTES = 65_507
# Errors by which a kernel or device says it cannot segment (not a full buffer).
GSO_REFUSED = frozenset({errno.EINVAL, errno.EIO, errno.ENOPROTOOPT, errno.EOPNOTSUPP})

_PACK_SIZE = struct.Struct("=H").pack
_UNPACK_INT = struct.Struct("=i").unpack_from
_GRO_CMSG_SPACE = socket.CMSG_SPACE(4) if sys.platform == "linux" else 0


def gso_supported(sock: socket.socket) -> bool:
    """Whether this socket accepts ``UDP_SEGMENT`` (Linux >= 4.18)."""
    if sys.platform != "linux":
        return False
    try:
        # 0 leaves per-socket segmentation off; a per-send cmsg sets the size.
        sock.setsockopt(SOL_UDP, UDP_SEGMENT, 0)
    except OSError:
        return False
    return True


def enable_gro(sock: socket.socket) -> bool:
    """Ask for ``UDP_GRO`` on the socket (Linux >= 5.0); False when refused."""
    if sys.platform != "linux":
        return False
    try:
        sock.setsockopt(SOL_UDP, UDP_GRO, 1)
    except OSError:
        return False
    return True


def gso_runs(datagrams: Sequence[tuple[bytes, Address]]) -> list[tuple[Address, int, list[bytes]]]:
    """Consecutive datagrams to one address that one GSO send can carry:
    ``(address, segment size, datagrams)``, every datagram but the last exactly
    the segment size, the last no larger, at most :data:`MAX_SEGMENTS` and
    :data:`MAX_GSO_BYTES` per run. The order of the datagrams is kept."""
    runs: list[tuple[Address, int, list[bytes]]] = []
    index = 0
    count = len(datagrams)
    while index < count:
        data, addr = datagrams[index]
        size = len(data)
        run = [data]
        total = size
        index += 1
        while index < count and len(run) < MAX_SEGMENTS:
            data, other = datagrams[index]
            length = len(data)
            if other != addr or length > size or total + length > MAX_GSO_BYTES:
                break
            run.append(data)
            total += length
            index += 1
            if length < size:  # a shorter segment ends the run
                break
        runs.append((addr, size, run))
    return runs


def send_gso(sock: socket.socket, addr: Address, size: int, run: list[bytes]) -> None:
    """One ``sendmsg`` carrying ``run`` as segments of ``size`` bytes."""
    sock.sendmsg(run, [(SOL_UDP, UDP_SEGMENT, _PACK_SIZE(size))], 0, addr)


def gro_cmsg_space() -> int:
    """The ancillary buffer ``recvmsg`` needs for the GRO segment size."""
    return _GRO_CMSG_SPACE


def split_gro(data: bytes, ancdata: list[tuple[int, int, bytes]]) -> list[bytes]:
    """The datagrams of one ``recvmsg`` on a GRO socket: ``data`` cut at the
    segment size the kernel reported (one datagram when it reported none)."""
    for level, kind, value in ancdata:
        if level == SOL_UDP and kind == UDP_GRO and len(value) >= 4:
            (size,) = _UNPACK_INT(value)
            if 0 < size < len(data):
                return [data[start : start + size] for start in range(0, len(data), size)]
    return [data]
