"""Our own asyncio datagram loop, server and client.

Both stacks' stock asyncio glue reads one datagram per loop turn and transmits
after every datagram. Here the socket is non-blocking and watched with
``loop.add_reader``; on each wake-up up to ``max_datagrams_per_wakeup``
ready datagrams are read, grouped per connection, fed to each connection once
(qh3: ``receive_many_datagrams``). A connection that received transmits with
its next write, so the ACK rides with the answer, or, if nothing is written
meanwhile, ``_RECEIVE_FLUSH_PASSES`` loop passes later. The first application
write of a loop turn is transmitted at once; further writes in the same turn
mark their connection dirty and are flushed together in one ``call_soon``
callback. Socket buffers are raised to
``socket_buffer_size`` (4 MiB by default; the kernel may cap this).

With ``udp_gso`` (the default) a transmit's datagrams to one address leave in
as few ``sendmsg`` calls as Linux UDP GSO allows (``felix_transport.udp``),
and with ``udp_gro`` one receive call may bring several datagrams of one sender
(``max_datagrams_per_wakeup`` still counts datagrams); where the kernel refuses
either, one datagram per call.

Server routing is by destination connection id: the client's original DCID
and every id the connection issues. Only QUIC v1 Initials of at least 1200
bytes open a connection; other unknown packets are dropped.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from . import udp
from .backends import Address, ConnectionAdapter, create_client_adapter, server_factory
from .config import TransportConfig
from .connection import Connection, ReceiveBudget
from .events import CONNECTION_REFUSED, INTERNAL_ERROR, NO_ERROR, ConnectionClosedError

__all__ = ["Server", "connect", "serve"]

logger = logging.getLogger(__name__)

_QUIC_V1 = b"\x00\x00\x00\x01"
_LOCAL_CID_LENGTH = 8  # both stacks' default connection_id_length
_MIN_INITIAL_SIZE = 1200
_RECV_SIZE = 65_535
_REFUSED_MEMORY = 1024
# Loop passes a connection that received waits for a write to carry its ACK
# before it transmits anyway. What a receive wakes is usually handled one or two
# passes later (a reader task wakes the caller awaiting an answer; the broker's
# reader spawns the request's task, which may wait once more on its storage).
# Counted at one cache request in flight: ACK-only datagrams ~0.5 per exchange
# each way -> ~0.03-0.2. The write itself is never delayed.
_RECEIVE_FLUSH_PASSES = 3

Handler = Callable[[Connection], Awaitable[None]]


def _make_socket(family: int, buffer_size: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_DGRAM)
    sock.setblocking(False)
    for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        # Best effort: the kernel caps at net.core.[rw]mem_max without privileges.
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, option, buffer_size)
    return sock


async def _resolve(host: str, port: int) -> tuple[int, Address]:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        if not infos:
            raise OSError(f"cannot resolve {host!r}") from None
        family, _, _, _, sockaddr = infos[0]
        return family, tuple(sockaddr)
    if ip.version == 6:
        return socket.AF_INET6, (host, port, 0, 0)
    return socket.AF_INET, (host, port)


class _Endpoint(abc.ABC):
    """Socket reading, batching and flushing shared by server and client."""

    def __init__(self, sock: socket.socket, config: TransportConfig) -> None:
        self._loop = asyncio.get_running_loop()
        self._sock = sock
        self._config = config
        self._dirty: set[Connection] = set()
        # Connections that received since they last transmitted: their ACK goes
        # with the next write, or in `_flush_acks` a few loop passes later.
        self._acks_due: set[Connection] = set()
        self._acks_scheduled = False
        self._flush_scheduled = False
        self._sock_closed = False
        self.send_errors = 0
        # System calls that sent, and the datagrams they carried.
        self.send_calls = 0
        self.datagrams_sent = 0
        self.gso = config.udp_gso and udp.gso_supported(sock)
        self.gro = config.udp_gro and udp.enable_gro(sock)
        # Datagrams a GRO receive brought past this wake-up's budget: the next
        # pass takes them first (at most one call's worth, 63 datagrams).
        self._carry: list[tuple[bytes, Address]] = []
        self._carry_scheduled = False
        self._loop.add_reader(
            sock.fileno(), self._on_readable_gro if self.gro else self._on_readable
        )

    # -- _Driver protocol ----------------------------------------------------

    def sendto(self, data: bytes, addr: Address) -> None:
        if self._sock_closed:
            return
        self.send_calls += 1
        self.datagrams_sent += 1
        try:
            self._sock.sendto(data, addr)
        except (BlockingIOError, InterruptedError):
            # Send buffer full: drop; QUIC loss recovery resends.
            self.send_errors += 1
        except OSError as exc:
            self.send_errors += 1
            logger.debug("sendto %s failed: %s", addr, exc)

    def send_datagrams(self, datagrams: list[tuple[bytes, Address]]) -> None:
        if len(datagrams) < 2 or not self.gso:
            for data, addr in datagrams:
                self.sendto(data, addr)
            return
        if self._sock_closed:
            return
        for addr, size, run in udp.gso_runs(datagrams):
            if len(run) == 1 or not self.gso:
                for data in run:
                    self.sendto(data, addr)
                continue
            self.send_calls += 1
            self.datagrams_sent += len(run)
            try:
                udp.send_gso(self._sock, addr, size, run)
            except (BlockingIOError, InterruptedError):
                self.send_errors += len(run)  # as above: loss recovery resends
            except OSError as exc:
                if exc.errno not in udp.GSO_REFUSED:
                    self.send_errors += len(run)
                    logger.debug("sendmsg %s failed: %s", addr, exc)
                    continue
                # Detected once: this socket (or the route's device) cannot
                # segment; from now on one datagram per call.
                logger.info("UDP GSO refused (%s); sending one datagram per call", exc)
                self.gso = False
                self.send_calls -= 1
                self.datagrams_sent -= len(run)
                for data in run:
                    self.sendto(data, addr)

    def schedule_transmit(self, connection: Connection) -> None:
        # The first write of a loop turn goes out at once (a lone request
        # should not wait a turn); later ones in the same turn are coalesced
        # into one flush, so a burst of small writes fills whole packets.
        if self._flush_scheduled:
            self._dirty.add(connection)
            return
        self._flush_scheduled = True
        self._loop.call_soon(self._flush)
        self._acks_due.discard(connection)  # this transmit carries the ACK
        connection._transmit()

    def connection_id_issued(self, connection: Connection, cid: bytes) -> None:
        return None

    def connection_id_retired(self, connection: Connection, cid: bytes) -> None:
        return None

    def handshake_completed(self, connection: Connection) -> None:
        return None

    def connection_terminated(self, connection: Connection) -> None:
        self._dirty.discard(connection)
        self._acks_due.discard(connection)

    # -- loop ------------------------------------------------------------------

    def _flush_acks(self, passes: int) -> None:
        if passes > 1:
            self._loop.call_soon(self._flush_acks, passes - 1)
            return
        self._acks_scheduled = False
        due = self._acks_due
        self._acks_due = set()
        for connection in due:
            connection._transmit()

    def _flush(self) -> None:
        self._flush_scheduled = False
        dirty = self._dirty
        self._dirty = set()
        for connection in dirty:
            self._acks_due.discard(connection)
            connection._transmit()

    def _on_readable(self) -> None:
        batch: dict[Connection, list[tuple[Address, list[bytes]]]] = {}
        recvfrom = self._sock.recvfrom
        for _ in range(self._config.max_datagrams_per_wakeup):
            try:
                data, addr = recvfrom(_RECV_SIZE)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                # e.g. ECONNREFUSED from an ICMP error on a connected socket.
                logger.debug("recvfrom failed: %s", exc)
                break
            self._add(batch, data, addr)
        self._deliver(batch)

    def _on_readable_gro(self) -> None:
        # As _on_readable, but one call may return several datagrams of one sender
        # glued together (UDP GRO), cut apart at the segment size the kernel
        # reports. max_datagrams_per_wakeup still counts datagrams, not calls:
        # what a call brings past it waits in _carry for the next pass, so a paused
        # connection takes in no more per wake-up than without GRO.
        self._carry_scheduled = False
        batch: dict[Connection, list[tuple[Address, list[bytes]]]] = {}
        budget = self._config.max_datagrams_per_wakeup
        carry = self._carry
        if carry:
            for data, addr in carry[:budget]:
                self._add(batch, data, addr)
            taken = min(budget, len(carry))
            del carry[:taken]
            budget -= taken
        recvmsg = self._sock.recvmsg
        space = udp.gro_cmsg_space()
        while budget > 0:
            try:
                data, ancdata, _flags, addr = recvmsg(_RECV_SIZE, space)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                logger.debug("recvmsg failed: %s", exc)
                break
            if not ancdata:
                self._add(batch, data, addr)
                budget -= 1
                continue
            pieces = udp.split_gro(data, ancdata)
            for piece in pieces[:budget]:
                self._add(batch, piece, addr)
            carry.extend((piece, addr) for piece in pieces[budget:])
            budget -= len(pieces)
        if carry and not self._carry_scheduled and not self._sock_closed:
            self._carry_scheduled = True
            self._loop.call_soon(self._on_readable_gro)
        self._deliver(batch)

    def _add(
        self, batch: dict[Connection, list[tuple[Address, list[bytes]]]], data: bytes, addr: Address
    ) -> None:
        connection = self._route(data, addr)
        if connection is None:
            return
        runs = batch.get(connection)
        if runs is None:
            batch[connection] = [(addr, [data])]
        elif runs[-1][0] == addr:
            runs[-1][1].append(data)
        else:
            runs.append((addr, [data]))

    def _deliver(self, batch: dict[Connection, list[tuple[Address, list[bytes]]]]) -> None:
        if not batch:
            return
        now = self._loop.time()
        for connection, runs in batch.items():
            connection._datagrams_received(runs, now)
            self._after_receive(connection)
        # No transmit here: the handlers woken by this receive write their
        # answers first (schedule_transmit), and the ACK leaves with them instead
        # of in an ACK-only datagram of its own; a connection that wrote nothing
        # meanwhile transmits in _flush_acks.
        self._acks_due.update(batch)
        if not self._acks_scheduled:
            self._acks_scheduled = True
            self._loop.call_soon(self._flush_acks, _RECEIVE_FLUSH_PASSES)

    @abc.abstractmethod
    def _route(self, data: bytes, addr: Address) -> Connection | None:
        """The connection a datagram belongs to (None: drop it)."""

    def _after_receive(self, connection: Connection) -> None:
        return None

    def _close_socket(self) -> None:
        if self._sock_closed:
            return
        self._sock_closed = True
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()


class Server(_Endpoint):
    """A listening QUIC endpoint; see :func:`serve`."""

    def __init__(
        self,
        sock: socket.socket,
        config: TransportConfig,
        on_connection: Handler,
        max_connections: int | None,
    ) -> None:
        super().__init__(sock, config)
        self._factory = server_factory(config)
        self._on_connection = on_connection
        self._max_connections = max_connections
        self._routes: dict[bytes, Connection] = {}
        self._cids: dict[Connection, set[bytes]] = {}
        self._live: set[Connection] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._closed_task: asyncio.Task[None] | None = None
        self.refused_connections = 0
        self._refused_cids: OrderedDict[bytes, None] = OrderedDict()
        self._preauth = (
            None
            if config.preauth_stream_window is None
            else ReceiveBudget(config.preauth_global_budget)
        )

    @property
    def address(self) -> Address:
        """The bound ``(host, port)`` (IPv6: 4-tuple)."""
        return tuple(self._sock.getsockname())

    @property
    def preauth_buffered_bytes(self) -> int:
        """Bytes buffered by connections not trusted yet (0 without pre-auth bounds)."""
        return 0 if self._preauth is None else self._preauth.used

    @property
    def connections(self) -> frozenset[Connection]:
        """Connections not yet terminated (refused ones excluded)."""
        return frozenset(self._live)

    def close(self) -> None:
        """Stop accepting, close every connection (NO_ERROR) and release the socket."""
        if self._closing:
            return
        self._closing = True
        self._loop.remove_reader(self._sock.fileno())
        for connection in list(self._cids):
            connection.close(NO_ERROR, "server shutting down")
        self._closed_task = self._loop.create_task(self._finish_close())

    async def wait_closed(self) -> None:
        """Wait until every connection and handler has finished."""
        if self._closed_task is None:
            raise RuntimeError("call close() first")
        await asyncio.shield(self._closed_task)

    async def __aenter__(self) -> Server:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()
        await self.wait_closed()

    async def _finish_close(self) -> None:
        waits = [c.wait_closed() for c in list(self._cids)]
        # Draining lasts three PTOs; bound it by the idle timeout just in case.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._config.idle_timeout):
                await asyncio.gather(*waits)
                if self._tasks:
                    await asyncio.gather(*self._tasks, return_exceptions=True)
        for task in self._tasks:
            task.cancel()
        self._close_socket()
        self._sock_closed = True

    # -- routing ---------------------------------------------------------------

    def _route(self, data: bytes, addr: Address) -> Connection | None:
        if not data:
            return None
        first = data[0]
        if first & 0x80:
            if len(data) < 7:
                return None
            dcid = data[6 : 6 + data[5]]
        else:
            dcid = data[1 : 1 + _LOCAL_CID_LENGTH]
        connection = self._routes.get(dcid)
        if connection is not None:
            return connection
        # Only a v1 Initial (long header, type 0) big enough opens a connection.
        if (
            self._closing
            or not first & 0x80
            or data[1:5] != _QUIC_V1
            or (first & 0x30) != 0
            or len(data) < _MIN_INITIAL_SIZE
        ):
            return None
        return self._accept(dcid)

    def _accept(self, dcid: bytes) -> Connection:
        adapter: ConnectionAdapter = self._factory.create(dcid)
        connection = Connection(self, adapter, self._config, is_client=False, budget=self._preauth)
        cids = {dcid, *adapter.initial_connection_ids}
        self._cids[connection] = cids
        for cid in cids:
            self._routes[cid] = connection
        if self._max_connections is not None and len(self._live) >= self._max_connections:
            connection.refused = True
            # A refused connection may terminate before the client's next
            # Initial arrives; that one is refused again but counted once.
            if dcid not in self._refused_cids:
                self.refused_connections += 1
                self._refused_cids[dcid] = None
                if len(self._refused_cids) > _REFUSED_MEMORY:
                    self._refused_cids.popitem(last=False)
        else:
            self._live.add(connection)
        return connection

    def _after_receive(self, connection: Connection) -> None:
        if connection.refused and not connection.closed:
            # Closing right after the client's first flight sends CONNECTION_CLOSE
            # (CONNECTION_REFUSED) in the Initial space: the handshake never ends.
            connection._close(CONNECTION_REFUSED, "server at max_connections", transport=True)

    def connection_id_issued(self, connection: Connection, cid: bytes) -> None:
        if connection in self._cids:
            self._cids[connection].add(cid)
            self._routes[cid] = connection

    def connection_id_retired(self, connection: Connection, cid: bytes) -> None:
        cids = self._cids.get(connection)
        if cids is not None:
            cids.discard(cid)
        if self._routes.get(cid) is connection:
            del self._routes[cid]

    def handshake_completed(self, connection: Connection) -> None:
        if connection.refused or self._closing:
            return
        task = self._loop.create_task(self._run_handler(connection))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def connection_terminated(self, connection: Connection) -> None:
        super().connection_terminated(connection)
        self._live.discard(connection)
        for cid in self._cids.pop(connection, ()):
            if self._routes.get(cid) is connection:
                del self._routes[cid]

    async def _run_handler(self, connection: Connection) -> None:
        try:
            await self._on_connection(connection)
        except asyncio.CancelledError:
            connection.close(NO_ERROR, "server shutting down")
            raise
        except Exception:
            logger.exception("connection handler failed for %r", connection)
            connection.close(INTERNAL_ERROR, "internal error")
        else:
            connection.close(NO_ERROR, "")


async def serve(
    config: TransportConfig,
    host: str,
    port: int,
    on_connection: Handler,
    *,
    max_connections: int | None = None,
) -> Server:
    """Listen on ``host:port`` (UDP) and run ``on_connection`` per connection.

    The handler runs once the handshake is complete; when it returns the
    connection is closed with NO_ERROR (INTERNAL_ERROR if it raised), so a
    handler lives as long as its connection should. Beyond
    ``max_connections`` live connections a new client is refused during the
    handshake: the server answers its first flight with CONNECTION_CLOSE
    carrying CONNECTION_REFUSED (0x2), which both stacks can send from the
    Initial packet space; the client's connect() fails with that code.
    """
    if max_connections is not None and max_connections < 0:
        raise ValueError("max_connections must be >= 0")
    family, addr = await _resolve(host, port)
    sock = _make_socket(family, config.socket_buffer_size)
    try:
        sock.bind(addr)
        return Server(sock, config, on_connection, max_connections)
    except BaseException:
        sock.close()
        raise


class _ClientEndpoint(_Endpoint):
    def __init__(self, sock: socket.socket, config: TransportConfig, remote: Address) -> None:
        super().__init__(sock, config)
        self.remote = remote
        self.connection: Connection | None = None

    def _route(self, data: bytes, addr: Address) -> Connection | None:
        return self.connection

    def connection_terminated(self, connection: Connection) -> None:
        super().connection_terminated(connection)
        self._close_socket()


async def connect(config: TransportConfig, host: str, port: int) -> Connection:
    """Open a client connection and wait for the handshake to complete.

    Raises :class:`ConnectionClosedError` with the peer's (or the idle
    timeout's) error code when the handshake fails.
    """
    family, remote = await _resolve(host, port)
    sock = _make_socket(family, config.socket_buffer_size)
    try:
        # Connecting picks the local address the route needs (127.0.0.1 for
        # loopback) without binding a wildcard.
        sock.connect(remote)
        endpoint = _ClientEndpoint(sock, config, remote)
    except BaseException:
        sock.close()
        raise
    loop = asyncio.get_running_loop()
    adapter = create_client_adapter(config)
    connection = Connection(endpoint, adapter, config, is_client=True)
    endpoint.connection = connection
    adapter.connect(remote, loop.time())
    connection._transmit()
    try:
        await connection.wait_handshake()
    except ConnectionClosedError:
        raise
    except BaseException:
        connection.close(NO_ERROR, "connect cancelled")
        raise
    return connection
