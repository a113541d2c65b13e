"""A streamed answer (server-sent events) whose client must keep reading it.

A client that stops reading a stream (hung, partitioned, or on purpose) leaves the gateway's
writes waiting on a full connection: without a bound, its request would hold its admission
slot, its place in the tenant's limits and its engine's KV until the answer ends or the
request's deadline passes, and the engine would go on producing tokens nobody reads.

So every write of a stream must be taken within `stall_s` (`--stream-stall-s`, 30 s): a
client that reads slowly but reads keeps its stream, one that takes no bytes for that long
has its answer ended there. The events' generator is closed, which cancels the request at its
engine (its KV is freed within a step) and books it as 499; the request gives back its
admission slot as it returns; the gateway logs it with the request id and counts it in
`k25_gateway_stalled_streams`. The connection is closed without the stream's end.
"""

import asyncio
import logging

from fastapi.responses import StreamingResponse
from prometheus_client import Counter

from services.gateway.request_id import current_request_id

log = logging.getLogger(__name__)

HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class _Stalled(Exception):
    pass


class EventStream(StreamingResponse):
    def __init__(self, events, stall_s: float, stalled: Counter):
        """`events`: an async generator of server-sent events, closed when the stream ends however
        it ends; `stalled`: the counter of streams ended because their client stopped reading."""
        super().__init__(events, media_type="text/event-stream", headers=HEADERS)
        self.stall_s = stall_s
        self.stalled = stalled
        self.request_id = current_request_id()  # made inside its request: the id in its log lines

    async def stream_response(self, send) -> None:
        async def bounded(message) -> None:
            try:
                async with asyncio.timeout(self.stall_s):
                    await send(message)
            except TimeoutError:
                raise _Stalled from None

        try:
            await super().stream_response(bounded)
        except _Stalled:
            log.warning("request %s: its client took nothing of the streamed answer for %g s (--stream-stall-s); "
                        "the answer is cancelled and its place given back", self.request_id, self.stall_s)
            self.stalled.inc()
        finally:
            await self.body_iterator.aclose()  # a generator cut short ends its engine request
