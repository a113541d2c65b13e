"""What a stopping gateway does with its clients' keep-alive connections.

On SIGTERM uvicorn closes the listening port and lets the requests in flight finish. Left to
itself it also closes every idle keep-alive connection at once, and each busy one when its
answer ends, without saying so in the answer: a client that has just sent its next request on
such a connection reads a reset, before any answer. Here, from the stop on:

- no connection is closed under a client: an idle one stays open while any request is in
  flight, and is closed once none is (or when the drain timeout cancels them);
- a request arriving on an open connection is answered 503 `shutting_down` with
  `Connection: close` and `Retry-After` (OpenAI's clients retry a 503, on a new connection,
  which another replica takes);
- an answer in flight that has not started yet says `Connection: close`, so that its client
  does not reuse the connection.
"""

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol

from services.gateway.errors import RETRY_AFTER_S, OpenAIError, send_error

_POLL_S = 0.1  # how often an idle connection looks whether the requests in flight have finished


class Drain:
    """Whether the gateway has begun to stop: set by its connections, read by `RefuseWhileDraining`."""

    def __init__(self):
        self.started = False


def shutting_down() -> OpenAIError:
    return OpenAIError(503, "this gateway replica is shutting down; retry the request on a new connection",
                       "server_error", "shutting_down",
                       headers={"Retry-After": str(RETRY_AFTER_S), "Connection": "close"})


class RefuseWhileDraining:
    """ASGI middleware: a request that arrives once the gateway stops is refused before any work,
    and an answer that starts once it stops closes its connection."""

    def __init__(self, app, drain: Drain):
        self.app, self.drain = app, drain

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.drain.started:
            return await send_error(send, shutting_down())

        async def send_closing_when_draining(message):
            if message["type"] == "http.response.start" and self.drain.started:
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, send_closing_when_draining)


class DrainingH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 connection, which its server asks to shut down when the gateway stops."""

    def __init__(self, *args, drain: Drain, **kwargs):
        super().__init__(*args, **kwargs)
        self.drain = drain

    def shutdown(self) -> None:
        self.drain.started = True
        if self.timeout_keep_alive_task is not None:  # an idle connection waits for the drain, not its timer
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
        self.loop.create_task(self._close_when_nothing_is_in_flight())

    async def _close_when_nothing_is_in_flight(self) -> None:
        while self.tasks and not self.transport.is_closing():  # every connection's requests
            await asyncio.sleep(_POLL_S)
        if not self.transport.is_closing():
            super().shutdown()  # closes it now that it is idle
