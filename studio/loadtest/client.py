"""A minimal HTTP/1.1 client on asyncio streams: one connection per request, the body handed on piece
by piece as it arrives (chunked, Content-Length or close-delimited), so first bytes can be timed."""

from __future__ import annotations

import asyncio
import io
import json
import ssl
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

_READ = 1 << 16


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    tls: bool
    base_path: str

    @classmethod
    def parse(cls, url: str) -> Target:
        s = urlsplit(url)
        return cls(s.hostname or "127.0.0.1", s.port or (443 if s.scheme == "https" else 80), s.scheme == "https",
                   s.path.rstrip("/"))


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    body: bytes = b""
    content_type: str | None = None

    def encode(self, target: Target) -> bytes:
        host = f"[{target.host}]" if ":" in target.host else target.host
        lines = [f"{self.method} {target.base_path}{self.path} HTTP/1.1", f"Host: {host}:{target.port}",
                 "User-Agent: sovits-studio-loadtest", "Accept: */*", "Connection: close"]
        if self.method != "GET" or self.body:
            lines.append(f"Content-Length: {len(self.body)}")
        if self.content_type:
            lines.append(f"Content-Type: {self.content_type}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + self.body


class IncompleteResponse(Exception):
    """The connection closed before the response said it was complete."""


def client_source(target: Target, serial: int) -> str | None:
    """The address simulated client ``serial`` connects from: on Linux, to a server on 127.0.0.1, a loopback
    address of its own (Linux routes all of 127.0.0.0/8 to itself), so that a server's per-address bounds
    (max_uploads_per_client, max_connections_per_client) see many users, as they would from many machines;
    elsewhere None (the system's choice: macOS only has 127.0.0.1)."""
    if target.host != "127.0.0.1" or not sys.platform.startswith("linux"):
        return None
    n = serial % (254 * 256)
    return f"127.0.{1 + n // 254}.{1 + n % 254}"


async def exchange(target: Target, request: Request, on_status: Callable[[int], None],
                   on_body: Callable[[bytes], None], source: str | None = None) -> int:
    """Send ``request`` (from address ``source``, else the system's choice); call ``on_status`` with the status
    code once the headers are in, then ``on_body`` with each piece of the body as it arrives (chunked,
    Content-Length or close-delimited); returns the status code."""
    reader, writer = await asyncio.open_connection(target.host, target.port,
                                                   ssl=ssl.create_default_context() if target.tls else None,
                                                   limit=_READ, local_addr=(source, 0) if source else None)
    try:
        writer.write(request.encode(target))
        await writer.drain()
        status_line = await reader.readline()
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
            raise IncompleteResponse(f"not an HTTP response: {status_line[:80]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        while True:
            line = await reader.readline()
            if not line.endswith(b"\n"):
                raise IncompleteResponse("the connection closed inside the headers")
            if line in (b"\r\n", b"\n"):
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        on_status(status)
        if request.method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            return status
        if "chunked" in headers.get("transfer-encoding", "").lower():
            await _read_chunked(reader, on_body)
        elif headers.get("content-length", "").isdigit():
            await _read_exactly(reader, int(headers["content-length"]), on_body)
        else:
            while piece := await reader.read(_READ):
                on_body(piece)
        return status
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (OSError, ssl.SSLError):
            pass


async def _read_exactly(reader: asyncio.StreamReader, n: int, on_body: Callable[[bytes], None]) -> None:
    while n > 0:
        piece = await reader.read(min(n, _READ))
        if not piece:
            raise IncompleteResponse(f"the connection closed with {n} body bytes still due")
        on_body(piece)
        n -= len(piece)


async def _read_chunked(reader: asyncio.StreamReader, on_body: Callable[[bytes], None]) -> None:
    while True:
        line = await reader.readline()
        if not line.endswith(b"\n"):
            raise IncompleteResponse("the connection closed before the last chunk")
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise IncompleteResponse(f"bad chunk size line {line[:40]!r}") from None
        if size == 0:
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return
        await _read_exactly(reader, size, on_body)
        await reader.readexactly(2)  # CRLF after the chunk


async def simple(target: Target, request: Request, timeout_s: float = 30.0) -> tuple[int, bytes]:
    """A small request answered whole: (status, body)."""
    status: list[int] = []
    body = bytearray()
    await asyncio.wait_for(exchange(target, request, status.append, body.extend), timeout_s)
    return status[0], bytes(body)


def multipart(fields: dict[str, Any], files: dict[str, tuple[str, bytes]]) -> tuple[bytes, str]:
    """A multipart/form-data body and its content type."""
    boundary = uuid.uuid4().hex
    out = io.BytesIO()
    for name, value in fields.items():
        text = json.dumps(value) if isinstance(value, bool) else str(value)
        out.write(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode())
        out.write(text.encode("utf-8") + b"\r\n")
    for name, (filename, data) in files.items():
        out.write(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
                  f"Content-Type: application/octet-stream\r\n\r\n".encode())
        out.write(data + b"\r\n")
    out.write(f"--{boundary}--\r\n".encode())
    return out.getvalue(), f"multipart/form-data; boundary={boundary}"
