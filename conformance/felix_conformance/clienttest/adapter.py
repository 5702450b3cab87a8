"""The adapter process: the client under test, driven over JSON lines.

One process per case. Requests go to its stdin, replies come from its stdout
(validated against `schema/adapter.schema.json`), stderr is kept for the log.
Every reply is awaited with a timeout, and the process is killed if it does
not exit when its stdin closes: a broken client cannot hang the tester.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from functools import cache
from importlib import resources
from typing import Any

import jsonschema

__all__ = ["Adapter", "AdapterError", "adapter_schema"]

REPLY_TIMEOUT = 15.0
EXIT_TIMEOUT = 5.0
# One reply line may carry a batch of payloads; anything longer is a broken adapter.
MAX_LINE = 4 * 1024 * 1024


class AdapterError(Exception):
    """The adapter broke the protocol: no reply, a malformed one, or it died."""


@cache
def adapter_schema() -> dict[str, Any]:
    text = (
        resources.files(__package__.rsplit(".", 1)[0])
        .joinpath("schema/adapter.schema.json")
        .read_text()
    )
    schema: dict[str, Any] = json.loads(text)
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def _validator(part: str) -> jsonschema.Draft202012Validator:
    schema = adapter_schema()
    return jsonschema.Draft202012Validator({"$defs": schema["$defs"], "$ref": f"#/$defs/{part}"})


class Adapter:
    def __init__(self, command: str) -> None:
        self.command = command
        self._process: asyncio.subprocess.Process | None = None
        self._next_id = 0
        self.transcript: list[str] = []  # requests and replies, for the case's log
        self._stderr = b""
        self._stderr_task: asyncio.Task[None] | None = None
        self._requests = _validator("request")
        self._replies = _validator("reply")

    async def start(self) -> None:
        self._process = await asyncio.create_subprocess_shell(
            self.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=MAX_LINE,
        )
        self._stderr_task = asyncio.ensure_future(self._drain_stderr())

    async def _drain_stderr(self) -> None:
        assert self._process is not None and self._process.stderr is not None
        while chunk := await self._process.stderr.read(65536):
            self._stderr = (self._stderr + chunk)[-65536:]  # the tail is what explains a crash

    async def call(self, request: dict[str, Any], timeout: float = REPLY_TIMEOUT) -> dict[str, Any]:
        """Send one request and return the adapter's reply to it."""
        process = self._process
        assert process is not None and process.stdin is not None and process.stdout is not None
        self._next_id += 1
        body = {"id": self._next_id, **request}
        errors = list(self._requests.iter_errors(body))
        assert not errors, errors  # the kit's own requests always follow the schema
        line = json.dumps(body)
        self.transcript.append(f"kit -> adapter {line}")
        try:
            process.stdin.write(line.encode() + b"\n")
            await process.stdin.drain()
            async with asyncio.timeout(timeout):
                raw = await process.stdout.readline()
        except TimeoutError:
            raise AdapterError(f"no reply to {request['op']} within {timeout:g}s") from None
        except (BrokenPipeError, ConnectionResetError, ValueError) as exc:
            raise AdapterError(f"the adapter's pipe broke: {exc}") from None
        if not raw:
            raise AdapterError(f"the adapter exited before replying to {request['op']}")
        text = raw.decode(errors="replace").strip()
        self.transcript.append(f"adapter -> kit {text}")
        try:
            reply: Any = json.loads(text)
        except json.JSONDecodeError as exc:
            raise AdapterError(f"not a JSON reply: {exc}") from None
        problems = sorted(self._replies.iter_errors(reply), key=lambda e: -len(e.absolute_path))
        if problems:
            best = jsonschema.exceptions.best_match(problems) or problems[0]
            raise AdapterError(f"a reply against the adapter schema: {best.message}")
        if reply["id"] != body["id"]:
            raise AdapterError(f"reply id {reply['id']} to request id {body['id']}")
        result: dict[str, Any] = reply
        return result

    async def stop(self) -> str:
        """Close stdin, wait for the exit (kill after a grace period); the stderr tail."""
        process = self._process
        if process is None:
            return ""
        if process.stdin is not None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                process.stdin.close()
        try:
            async with asyncio.timeout(EXIT_TIMEOUT):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()
            self.transcript.append("adapter did not exit when its stdin closed: killed")
        if self._stderr_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                async with asyncio.timeout(EXIT_TIMEOUT):
                    await self._stderr_task
        return self._stderr.decode(errors="replace")
