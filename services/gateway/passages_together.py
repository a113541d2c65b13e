"""A question answered from its passages read together: the chosen passages and the question in
one prompt, and one answer from it, when they fit the model's context beside the answer.

The other way (documents.py) notes each passage on its own and then answers from the notes: it
reuses each passage's KV from the prefix cache, but decodes twice in a row (a note for every
passage, then the answer), with as many sequences as passages. Read together, a question costs one
prefill of its passages and one answer: fewer prompt tokens and half the decoding steps (measured
in docs/benchmarks), so `auto` reads together whenever the prompt fits, and takes notes for what
does not (many passages, or a small context). Reading every passage of a long document never fits: it
is read as notes. So is a document warmed at upload: the warm-up prefilled each passage's note
prompt, and a question that reuses them computes only its own tokens (on an AVX2-only CPU, where
prefill is dear, 0.38-0.48x the time of the same question read together: docs/benchmarks).
"""

from typing import Literal

from services.gateway.documents import cited
from services.gateway.errors import OpenAIError, invalid_request

Reading = Literal["auto", "together", "notes"]


def together_messages(question: str, passages: list) -> list[dict]:
    """The passages (in document order, each marked [n] with the clause it opens at) and the question."""
    parts = "\n\n".join(f"[{p.index}] ({p.anchor or 'part ' + str(p.index)})\n{p.text}" for p in passages)
    return [
        {"role": "system", "content": "You answer questions about a document from the parts of it you are given."},
        {"role": "user", "content": (
            f"Parts of the document, each marked [n] with the clause it opens at:\n\n{parts}\n\n"
            f"Question: {question}\n\nAnswer from these parts only, and cite the [n] of each part you use. "
            f"If they do not say, answer that these parts of the document do not say."
        )},
    ]


def how_to_read(asked: Reading, prompt_tokens: int, max_tokens: int, context: int | None, warm: bool = False) -> str:
    """`together` or `notes`: what was asked; `auto` as notes for a document warmed at upload (each
    passage's note prompt was prefilled then: a question computes little more than its own tokens,
    where the passages read together would be a prompt no one computed), else together when the
    prompt and the answer fit the largest context of the pools (or no context is known yet: the
    engine refuses what it cannot hold). Raises a 400 when `together` was asked for passages that
    do not fit."""
    fits = context is None or prompt_tokens + max_tokens <= context
    if asked == "notes" or (asked == "auto" and (warm or not fits)):
        return "notes"
    if not fits:
        raise too_long_together(prompt_tokens, max_tokens, context)
    return "together"


def too_long_together(prompt_tokens: int, max_tokens: int, context: int) -> OpenAIError:
    return invalid_request(
        f"the passages read together need {prompt_tokens + max_tokens} tokens (prompt {prompt_tokens} + max_tokens "
        f"{max_tokens}) but the largest context of any engine pool is {context}: read fewer passages, or "
        f"`\"read\": \"notes\"`", "read", "context_length_exceeded")


def together_citations(answer: str, passages: list) -> list[dict]:
    """An answer's citations when it read its passages together: those it cites by [n], else every
    passage it was given (it took no notes that would say which bore on the question)."""
    return [p.citation() for p in (cited(answer, passages) or passages)]
