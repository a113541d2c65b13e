"""A streamed document answer that shows its progress: which passages it reads, before any is
asked; one event as each passage's note is taken; then the answer's own events.

Everything that can refuse the question (the document, the passages' choice, the tenant's
rate) has run before this response starts, so those are still HTTP errors; a failure after it
started (a note's engine request) is an error event, as in any stream. A client that leaves
cancels the notes still running."""

import asyncio
import logging

from fastapi.responses import StreamingResponse

from services.gateway.errors import OpenAIError, internal_error
from services.gateway.request_id import current_request_id
from services.gateway.responses import sse

log = logging.getLogger(__name__)


def progress_stream(passages_read: list[dict], read_notes, answer) -> StreamingResponse:
    """`read_notes(noted)` takes every note, calling `noted(passage)` after each; `answer()` then
    returns the answer's StreamingResponse."""
    return StreamingResponse(_events(passages_read, read_notes, answer), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _events(passages_read: list[dict], read_notes, answer):
    yield sse({"object": "document.passages", "passages_read": passages_read})
    noted: asyncio.Queue = asyncio.Queue()
    notes = asyncio.create_task(read_notes(noted.put_nowait))
    done = 0
    try:
        while not (notes.done() and noted.empty()):
            waiting = asyncio.create_task(noted.get())
            await asyncio.wait({notes, waiting}, return_when=asyncio.FIRST_COMPLETED)
            if not waiting.done():
                waiting.cancel()
                continue
            passage = waiting.result()
            done += 1
            yield sse({"object": "document.progress", "read": done, "of": len(passages_read),
                       "passage": passage.citation(), "bears_on_question": passage.relevant})
        notes.result()  # raises the notes' failure
        response = await answer()
    except OpenAIError as error:
        yield sse(error.body())
        return
    except Exception:  # the gateway's own failure: an error event, the details in the log
        request_id = current_request_id()
        log.exception("request %s failed while its passages were read", request_id)
        yield sse(internal_error(500, "the gateway failed on this request", "internal_error", request_id).body())
        return
    finally:
        if not notes.done():  # the client left
            notes.cancel()
    async for event in response.body_iterator:
        yield event
