"""The progress of a streamed document request: what it reads first, an event per passage read,
then the events that end it; a failed read is an error event and nothing more is asked for; a
client that leaves stops the reading."""

import asyncio
import json

from fastapi.responses import StreamingResponse

from services.gateway.document_stream import _events, progress_event
from services.gateway.documents import Passage
from services.gateway.errors import invalid_request

READ = [{"index": 2}, {"index": 1}]


def payloads(events: list[str]) -> list:
    return [json.loads(e.removeprefix("data: ")) if e.strip() != "data: [DONE]" else "[DONE]" for e in events]


OPENING = {"object": "document.passages", "passages_read": READ}


async def collect(read_notes, answer) -> list[str]:
    return [event async for event in _events(OPENING, read_notes, answer)]


def test_the_opening_then_a_progress_event_per_passage_then_the_ending_s_events():
    async def read_notes(progress):
        for done, (index, note) in enumerate(((1, "NOTHING"), (2, "fees are due monthly")), start=1):
            await asyncio.sleep(0)
            passage = Passage(index, f"Section {index}", 0, 1, "text", note)
            progress(progress_event(done, 2, passage, bears_on_question=passage.relevant))

    async def answer():
        async def body():
            yield "data: [DONE]\n\n"
        return StreamingResponse(body()).body_iterator

    events = payloads(asyncio.run(collect(read_notes, answer)))
    assert events[0] == OPENING
    assert [(e["read"], e["of"], e["passage"]["index"], e["bears_on_question"]) for e in events[1:3]] == [
        (1, 2, 1, False), (2, 2, 2, True)]
    assert events[3:] == ["[DONE]"]


def test_a_failed_note_is_an_error_event_and_no_answer_is_asked_for():
    asked = []

    async def read_notes(noted):
        raise invalid_request("note 2 failed")

    async def answer():
        asked.append(True)

    events = payloads(asyncio.run(collect(read_notes, answer)))
    assert events[-1]["error"]["message"] == "note 2 failed" and asked == []


def test_a_client_that_leaves_stops_the_notes():
    cancelled = asyncio.Event()

    async def read_notes(noted):
        try:
            await asyncio.Event().wait()  # notes that would never end
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def leave_after_the_first_event():
        events = _events(OPENING, read_notes, None)
        await anext(events)
        reading = asyncio.create_task(anext(events))
        await asyncio.sleep(0)
        reading.cancel()  # the client went away while the notes ran
        await asyncio.gather(reading, return_exceptions=True)
        await asyncio.wait_for(cancelled.wait(), 10)
        return cancelled.is_set()

    assert asyncio.run(leave_after_the_first_event())
