"""Request bodies under three bounds, before any of one is parsed: its size (413), the time it
may take to arrive (408), and the bytes all the bodies this gateway holds may take (503).

A declared Content-Length over the size limit is refused at once; a body sent without one is
read up to the limit and no further, so a client cannot get past the limit by leaving the
header out. Every body is read whole here, within `read_timeout_s` of its request's start, and
then handed on: a client that sends its body slowly gives up its admission slot at that
deadline instead of holding it. Each request counts against the bodies in flight from its
start to its end with what its body may take (its Content-Length, or the size limit when it
declares none); one that would pass `max_bytes_in_flight` is refused with 503 at once, so that
many large bodies at once cannot take the gateway past its memory.
"""

import asyncio

from prometheus_client import Gauge

from services.gateway.errors import OpenAIError, overloaded, send_error


class _TooLarge(Exception):
    pass


class BodySizeLimit:
    def __init__(self, app, max_bytes: int, read_timeout_s: float = 30.0, max_bytes_in_flight: int = 512 << 20,
                 gauge: Gauge | None = None):
        self.app = app
        self.max_bytes = max_bytes
        self.read_timeout_s = read_timeout_s
        self.max_bytes_in_flight = max_bytes_in_flight
        self.bytes_in_flight = 0  # what the requests now in flight may hold in bodies
        self.gauge = gauge  # shows bytes_in_flight

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            return await self._refuse(send)
        charge = int(declared) if declared is not None else self.max_bytes
        if self.bytes_in_flight + charge > self.max_bytes_in_flight:
            return await send_error(send, overloaded(
                f"the request bodies this gateway holds are at its limit of {self.max_bytes_in_flight} bytes; "
                "try again shortly"))
        self._count(charge)
        try:
            try:
                async with asyncio.timeout(self.read_timeout_s):
                    body = await self._read(receive)
            except _TooLarge:
                return await self._refuse(send)
            except TimeoutError:
                return await send_error(send, OpenAIError(
                    408, f"the request body did not arrive within {self.read_timeout_s:g} s", "invalid_request_error",
                    "request_timeout"))
            if body is None:
                return  # the client left
            await self.app(scope, _replay(body, receive), send)
        finally:
            self._count(-charge)

    def _count(self, change: int) -> None:
        self.bytes_in_flight += change
        if self.gauge is not None:
            self.gauge.set(self.bytes_in_flight)

    async def _read(self, receive) -> bytes | None:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                raise _TooLarge
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _refuse(self, send):
        await send_error(send, OpenAIError(413, f"request body is larger than this gateway's limit of {self.max_bytes} bytes",
                                           "invalid_request_error", "request_too_large"))


def _replay(body: bytes, receive):
    """The body as one message, then the client's own messages (its disconnect)."""
    replayed = False

    async def replay():
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
