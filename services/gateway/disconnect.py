"""Cancel the work of a request whose client has gone (the engines free its KV)."""

import asyncio

from fastapi import Request
from fastapi.responses import Response

DISCONNECT_POLL_S = 0.5


async def unless_client_leaves(request: Request, answer):
    """Await `answer`, but cancel it (and so the engine's work) if the client disconnects
    first. A streamed answer returns at its first token; the stream watches from then on."""
    task = asyncio.ensure_future(answer)
    while not task.done():
        await asyncio.wait([task], timeout=DISCONNECT_POLL_S)
        if not task.done() and await request.is_disconnected():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return Response(status_code=499)  # nobody reads it: the client has gone
    return task.result()
