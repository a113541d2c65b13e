"""Prompts to token ids off the event loop: chat templates render and text tokenises on a
small pool of threads (the tokenizers library releases the GIL while it encodes), so that a
long prompt never stalls the other requests' streams."""

import asyncio
import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import jinja2
from prometheus_client import Histogram

from common.tokenizer import Tokenizer
from services.gateway.errors import invalid_request
from services.gateway.request_id import current_request_id

log = logging.getLogger(__name__)


class PromptEncoder:
    def __init__(self, tokenizer: Tokenizer, threads: int, seconds: Histogram):
        self.tokenizer = tokenizer
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="k25-tokenize")
        self._seconds = seconds  # each prompt's time from asking to its ids, the wait for a thread included

    async def encode(self, text: str) -> list[int]:
        return await self._run(self.tokenizer.encode, text)

    async def encode_chat(self, messages: list[dict], **template_kwargs) -> list[int]:
        """The ids of the conversation rendered with the model's chat template (given
        `template_kwargs`, e.g. tools), or 400 when the template refuses it (its own message is
        for the client; any other failure is logged)."""
        try:
            return await self._run(functools.partial(self.tokenizer.encode_chat, **template_kwargs), messages)
        except jinja2.TemplateError as exc:
            if type(exc) is jinja2.TemplateError:  # the template's raise_exception(message)
                raise invalid_request(f"messages cannot be rendered with the model's chat template: {exc}",
                                      "messages") from None
            return self._refuse(exc)
        except (TypeError, ValueError) as exc:
            return self._refuse(exc)

    def _refuse(self, exc: Exception):
        request_id = current_request_id()
        log.warning("request %s: the chat template failed on its messages: %r", request_id, exc)
        raise invalid_request(f"messages cannot be rendered with the model's chat template (request id {request_id})",
                              "messages") from None

    async def _run(self, encode, prompt):
        started = time.perf_counter()
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, encode, prompt)
        finally:
            self._seconds.observe(time.perf_counter() - started)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
