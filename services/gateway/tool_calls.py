"""Tool calls read out of a model's answer: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`
blocks become OpenAI `tool_calls`, the text around them stays content.

`ToolCallReader` reads the answer as it streams: text that may still open a call is held
back, a call is given out once its block closes, and a block that is not a call of a known
tool (it does not parse, names another function, or never closes) is given back as the text
it was, so that nothing the model wrote is lost. Whitespace between calls is not content."""

import json
import uuid
from dataclasses import dataclass, field

from services.gateway.tool_grammar import CLOSE, OPEN


@dataclass(frozen=True)
class ParsedCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI gives it

    def body(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ToolCallReader:
    tool_names: frozenset[str]
    calls: list[ParsedCall] = field(default_factory=list)
    content: str = ""  # all content given out so far
    _buffer: str = ""
    _inside: bool = False
    _pending_space: str = ""  # whitespace given out only if more content follows

    def push(self, text: str) -> tuple[str, list[ParsedCall]]:
        """The content and calls that `text` completes (the content came before the calls)."""
        self._buffer += text
        given, content, calls = "", "", []
        while True:
            if not self._inside:
                start = self._buffer.find(OPEN)
                if start < 0:
                    keep = _partial_open(self._buffer)
                    content += self._buffer[: len(self._buffer) - keep]
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    break
                content += self._buffer[:start]
                self._buffer, self._inside = self._buffer[start + len(OPEN):], True
            else:
                end = self._buffer.find(CLOSE)
                if end < 0:
                    break
                block, self._buffer, self._inside = self._buffer[:end], self._buffer[end + len(CLOSE):], False
                call = self._call(block)
                if call is None:
                    content += OPEN + block + CLOSE
                    continue
                given += self._give(content)
                content, self._pending_space = "", ""  # whitespace before a call is not content
                calls.append(call)
        return given + self._give(content), calls

    def finish(self) -> str:
        """The content still held back when the answer ends (an unclosed block is content);
        whitespace after the last call is dropped."""
        rest = (OPEN if self._inside else "") + self._buffer
        self._buffer, self._inside = "", False
        text = self._give(rest)
        if not self.calls:
            text, self._pending_space = text + self._pending_space, ""
        return text

    def _give(self, content: str) -> str:
        """Content to give out now: whitespace waits until something else follows it."""
        if not content.strip():
            self._pending_space += content
            return ""
        out, self._pending_space = self._pending_space + content, ""
        self.content += out
        return out

    def _call(self, block: str) -> ParsedCall | None:
        try:
            call = json.loads(block)
        except ValueError:
            return None
        if not isinstance(call, dict) or call.get("name") not in self.tool_names or not isinstance(call.get("arguments", {}), dict):
            return None
        parsed = ParsedCall(f"call_{uuid.uuid4().hex[:24]}", call["name"],
                            json.dumps(call.get("arguments", {}), ensure_ascii=False))
        self.calls.append(parsed)
        return parsed


def _partial_open(text: str) -> int:
    """How many characters at the end of `text` could be the start of an OPEN."""
    for size in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-size:]):
            return size
    return 0


def read_answer(text: str, tool_names: frozenset[str]) -> tuple[str, list[ParsedCall]]:
    """A whole answer's content and calls."""
    reader = ToolCallReader(tool_names)
    content, calls = reader.push(text)
    return content + reader.finish(), calls


def tool_finish_reason(reason: str, calls: list[ParsedCall]) -> str:
    """OpenAI's finish reason of an answer that made calls and ended where it could."""
    return "tool_calls" if calls and reason == "stop" else reason
