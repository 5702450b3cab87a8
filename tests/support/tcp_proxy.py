"""A TCP relay on 127.0.0.1 that a test can cut and heal: a real network fault between
a client and a server (e.g. one broker and etcd) without touching either process."""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["TcpProxy"]

_CHUNK = 65536


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.cut_off = False

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def endpoint(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)

    def cut(self) -> None:
        """Drop every open connection and refuse new ones until `heal`."""
        self.cut_off = True
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def heal(self) -> None:
        self.cut_off = False

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut_off:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update({writer, up_writer})
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer)),
            asyncio.create_task(self._pump(up_reader, writer)),
        ]
        self._tasks.update(pumps)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pumps:
                task.cancel()
                self._tasks.discard(task)
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            while data := await reader.read(_CHUNK):
                writer.write(data)
                await writer.drain()
