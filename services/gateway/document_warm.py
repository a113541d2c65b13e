"""Warming a document's KV at upload (`POST /v1/documents` with `"warm": true`): each passage's
prompt prefix, the one every question and extraction about it opens with (documents.py
`passage_messages`), is prefilled on the engines, so that even the first question finds every
passage it reads in an engine's prefix cache (and the gateway routes it there).

A warm-up is an engine request per passage that generates one token, at most --document-fanout
at once, for the base model and the uploader's tenant (the cache is the tenant's own unless
tenants share it), charged to the tenant's token rate as prompts are."""

import time

from opentelemetry import trace

from services.gateway.document_jobs import Usage, document_job
from services.gateway.documents import PROMPT_TOKENS, Passage, all_bounded, passage_messages
from services.gateway.service import ReplyShape

tracer = trace.get_tracer("k25.gateway")


def warm_cost(passage_tokens: list[int]) -> int:
    """What the warm-up may spend, counted as its engine jobs are (prompt + one token each)."""
    return sum(tokens + PROMPT_TOKENS + 1 for tokens in passage_tokens)


async def warm_passages(gateway, passages: list[Passage], caller, ticket, parent_span) -> dict:
    """Prefill every passage's prompt prefix; what it took: the passages and the usage."""
    deadline = time.time() + gateway.settings.request_timeout_s
    usage = Usage()
    with tracer.start_as_current_span("k25.documents.warm", context=trace.set_span_in_context(parent_span)) as span:
        span.set_attribute("k25.chunks", len(passages))

        async def warm(passage: Passage) -> None:
            job = await document_job(gateway, gateway.settings.model_name, None, passage_messages(passage, ""), 1, caller,
                                     ticket, deadline)
            usage.add((await gateway.generate(job, ReplyShape(True), span)).final.usage)

        await all_bounded([lambda p=p: warm(p) for p in passages], gateway.settings.document_fanout)
    return {"passages": len(passages), "usage": usage.body()}
