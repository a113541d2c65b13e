"""Long-document questions: choose the passages that bear on the question, map the question over
them, reduce the notes into one answer, and cite the passages it drew on.

The final prompt holds as many notes as the model's context leaves room for beside the answer:
the notes of the best-ranked passages first (`notes_that_fit`); the answer says how many notes
bearing on the question were left out (256 passages of 128-token notes are more than a small
model's context, and a prompt longer than every pool's context would be refused after all the
notes were paid for).

The prompts, the passages' choice, the citation choice, the bound on passages per question and
what a question may cost are pure functions; `take_notes` runs the map requests concurrently, a bounded number at
a time (`all_bounded`, which the extraction's requests share), and when one fails stops the
others (their engine requests are cancelled) before the error is answered.
"""

import asyncio
import functools
import re
from dataclasses import dataclass, replace

from services.gateway.errors import OpenAIError, invalid_request
from services.gateway.passage_ranker import rank

NOTHING = "NOTHING"
# tokens a prompt adds to what it quotes: the system message, the template's turns, the instructions
PROMPT_TOKENS = 96
# tokens a note's citation mark and clause add to it in the final prompt
NOTE_MARK_TOKENS = 16
_CITED = re.compile(r"\[(\d+)\]")


@dataclass(frozen=True)
class Passage:
    """One passage of the document (as the chunker cut it) with what the map step noted in it."""

    index: int  # 1-based, as cited in the notes
    anchor: str
    start_char: int
    end_char: int
    text: str
    note: str = ""

    @property
    def relevant(self) -> bool:
        return bool(self.note.strip()) and not self.note.strip().upper().startswith(NOTHING)

    def citation(self) -> dict:
        return {"index": self.index, "anchor": self.anchor, "start_char": self.start_char, "end_char": self.end_char}


def passages_of(text: str, spans: list[dict]) -> list[Passage]:
    """The document's passages (1-based, as the prompts and citations number them)."""
    return [Passage(s["index"] + 1, s["anchor"], s["start_char"], s["end_char"], text[s["start_char"]:s["end_char"]])
            for s in spans]


# the prompts call a passage a "part", the plain word for the model. Everything that depends
# only on the document comes before the question, so that every later question about the same
# document finds each part's KV in an engine's prefix cache and computes only its own tokens.
def passage_messages(passage: Passage, task: str) -> list[dict]:
    """The passage, then what to do with it: the prompt of every request that reads one passage
    (a question's note, a field's extraction, the warming of its KV), so that all of them share
    the passage's KV."""
    opening = f" (it opens at {passage.anchor})" if passage.anchor else ""
    return [
        {"role": "system", "content": "You read one part of a long document and note only what in it bears on a question."},
        {"role": "user", "content": f"Part {passage.index} of the document{opening}:\n{passage.text}\n\n{task}"},
    ]


def map_messages(question: str, passage: Passage) -> list[dict]:
    return passage_messages(passage, (
        f"Question: {question}\n\n"
        f"Quote or summarise what in this part bears on the question, naming its clause or article. "
        f"If nothing in it does, answer exactly {NOTHING}."
    ))


def note_line(passage: Passage) -> str:
    """How a note stands in the final prompt: its [n], the clause it came from, the note."""
    return f"[{passage.index}] ({passage.anchor or 'part ' + str(passage.index)}) {passage.note.strip()}"


def reduce_messages(question: str, passages: list[Passage]) -> list[dict]:
    relevant = [p for p in passages if p.relevant]
    notes = "\n".join(note_line(p) for p in relevant)
    return [
        {"role": "system", "content": "You answer questions about a document from notes taken on its parts."},
        {"role": "user", "content": (
            f"Notes on the document, each marked [n] with the clause it came from:\n{notes or '(no part bears on it)'}\n\n"
            f"Question: {question}\n\nAnswer from the notes only, and cite the [n] of each note you use."
        )},
    ]


def notes_that_fit(ranked: list[Passage], line_tokens: list[int], room: int) -> tuple[list[Passage], int]:
    """The notes the final prompt holds when their lines may take `room` tokens: the relevant notes
    of `ranked` (best first), each line costing its `line_tokens` and one more for the line break,
    as many of the best as fit; in document order, with how many relevant notes were left out."""
    relevant = [(p, tokens) for p, tokens in zip(ranked, line_tokens, strict=True) if p.relevant]
    kept, used = [], 0
    for passage, tokens in relevant:
        if used + tokens + 1 > room:
            break
        kept.append(passage)
        used += tokens + 1
    return sorted(kept, key=lambda p: p.index), len(relevant) - len(kept)


def too_many_passages(passages: int, limit: int) -> OpenAIError | None:
    """The refusal of a question asked to read more passages than one request may fan out to, or None."""
    if passages <= limit:
        return None
    return invalid_request(f"a question may read at most {limit} passages (--max-document-passages); {passages} were "
                           f"asked for", "passages", "too_many_passages")


def choose_passages(question: str, passages: list[Passage], count: int) -> list[Passage]:
    """The `count` passages that bear most on the question, best first (passage_ranker.py)."""
    order = rank(question, [p.text for p in passages])
    return [passages[i] for i in order[:count]]


def question_cost(passage_tokens: list[int], question_tokens: int, note_max_tokens: int, max_tokens: int) -> int:
    """The most a question over these passages may spend, counted as its engine jobs are (prompt +
    max_tokens): a note per passage, then the answer, whose prompt holds every note."""
    notes = sum(tokens + question_tokens + PROMPT_TOKENS + note_max_tokens for tokens in passage_tokens)
    answer = len(passage_tokens) * (note_max_tokens + NOTE_MARK_TOKENS) + question_tokens + PROMPT_TOKENS + max_tokens
    return notes + answer


def cited(answer: str, passages: list[Passage]) -> list[Passage]:
    """The passages the answer cites by [n], in the order it first cites them."""
    by_index = {p.index: p for p in passages}
    return [by_index[n] for n in dict.fromkeys(int(m) for m in _CITED.findall(answer)) if n in by_index]


def citations(answer: str, passages: list[Passage]) -> list[dict]:
    """The passages the answer cites by [n]; if it cites none, every passage whose note bore on the question."""
    return [p.citation() for p in (cited(answer, passages) or [p for p in passages if p.relevant])]


async def take_notes(question: str, passages: list[Passage], note, concurrency: int, noted=None) -> list[Passage]:
    """Run `note(messages)` for every passage, at most `concurrency` at once; the passages with
    their notes, in order. `noted(passage)`, if given, is called with each passage and its note as
    it is taken. The first failure cancels every other note (all_bounded)."""

    async def one(passage: Passage) -> Passage:
        taken = replace(passage, note=await note(map_messages(question, passage)))
        if noted is not None:
            noted(taken)
        return taken

    return await all_bounded([functools.partial(one, p) for p in passages], concurrency)


async def all_bounded(calls: list, concurrency: int) -> list:
    """Await every `call()`, at most `concurrency` at once; their results, in order. The first
    failure cancels every other call and is raised once they have all stopped (their engine
    requests are cancelled)."""
    running = asyncio.Semaphore(concurrency)

    async def one(call):
        async with running:
            return await call()

    tasks = [asyncio.create_task(one(call)) for call in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:  # a call failed, or this request was cancelled (its client left)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
