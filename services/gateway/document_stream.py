"""A streamed document request that shows its progress: what it will read, before any passage is
asked; one event as each passage is read; then the events that end it (a question's answer, an
extraction's result).

Everything that can refuse the request (the document, the passages' choice, the tenant's rate)
has run before this response starts, so those are still HTTP errors; a failure after it
started (a passage's engine request) is an error event, as in any stream. A client that leaves
cancels the passages still being read."""

import asyncio
import logging

from services.gateway.errors import OpenAIError, internal_error
from services.gateway.event_stream import EventStream
from services.gateway.request_id import current_request_id
from services.gateway.responses import sse

log = logging.getLogger(__name__)


def progress_stream(gateway, opening: dict, read, ending) -> EventStream:
    """`opening` is the first event; `read(progress)` reads the passages, calling
    `progress(event)` with an event as each is read; `ending()` then returns the server-sent
    events that end the stream (an async generator). Its client must keep reading it
    (`gateway.event_stream`)."""
    return gateway.event_stream(_events(opening, read, ending))


def progress_event(done: int, of: int, passage, **more) -> dict:
    """The event of the `done`-th passage read of `of`."""
    return {"object": "document.progress", "read": done, "of": of, "passage": passage.citation(), **more}


async def _events(opening: dict, read, ending):
    yield sse(opening)
    progress: asyncio.Queue = asyncio.Queue()
    reading = asyncio.create_task(read(progress.put_nowait))
    try:
        while not (reading.done() and progress.empty()):
            waiting = asyncio.create_task(progress.get())
            await asyncio.wait({reading, waiting}, return_when=asyncio.FIRST_COMPLETED)
            if not waiting.done():
                waiting.cancel()
                continue
            yield sse(waiting.result())
        reading.result()  # raises the reading's failure
        events = await ending()
    except OpenAIError as error:
        yield sse(error.body())
        return
    except Exception:  # the gateway's own failure: an error event, the details in the log
        request_id = current_request_id()
        log.exception("request %s failed while its passages were read", request_id)
        yield sse(internal_error(500, "the gateway failed on this request", "internal_error", request_id).body())
        return
    finally:
        if not reading.done():  # the client left
            reading.cancel()
    try:
        async for event in events:
            yield event
    finally:  # a stream cut short (its client left or stopped reading) ends the answer's engine request
        await events.aclose()
