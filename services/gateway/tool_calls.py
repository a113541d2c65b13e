"""Tool calls read out of a model's answer: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`
blocks become OpenAI `tool_calls`, the text around them stays content.

`ToolCallReader` reads the answer as it streams. Text that may still open a call is held
back. Once a block's head (`{"name": "<a known tool>", "arguments":`) has arrived, the call
is given out and its arguments follow piece by piece as the model writes them, less what may
be the block's closing brace; the pieces join into the call's `arguments`, the same text a
whole answer gives. A block whose head is not a known tool's (it does not parse, names
another function, puts `arguments` first) is read whole once it closes and, if it is no call,
given back as the text it was, so that nothing the model wrote is lost. Whitespace between
calls is not content."""

import json
import re
import uuid
from dataclasses import dataclass, field

from services.gateway.tool_grammar import CLOSE, OPEN

# a call's head, as the tool grammar orders the keys (a JSON string may hold escaped quotes),
# whole once the arguments' first character has come
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(?=\S)')


@dataclass
class ParsedCall:
    id: str
    name: str
    arguments: str = ""  # JSON text, as OpenAI gives it (grows while a streamed call is read)

    def body(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class CallDelta:
    """A piece of a streamed call in OpenAI's delta shape: the first names the call, later ones
    carry more of its arguments."""
    index: int
    arguments: str
    call: ParsedCall | None = None  # set on the call's first piece

    def body(self) -> dict:
        if self.call is not None:
            return {"index": self.index, "id": self.call.id, "type": "function",
                    "function": {"name": self.call.name, "arguments": self.arguments}}
        return {"index": self.index, "function": {"arguments": self.arguments}}


@dataclass
class ToolCallReader:
    tool_names: frozenset[str]
    calls: list[ParsedCall] = field(default_factory=list)
    content: str = ""  # all content given out so far
    _buffer: str = ""
    _inside: bool = False
    _streaming: ParsedCall | None = None  # the call whose arguments are being given out
    _pending_space: str = ""  # whitespace given out only if more content follows

    def push(self, text: str) -> list[str | CallDelta]:
        """What `text` completes, in order: content (str) and pieces of calls."""
        self._buffer += text
        out: list[str | CallDelta] = []
        while True:
            if not self._inside:
                start = self._buffer.find(OPEN)
                if start < 0:
                    keep = _partial_end(self._buffer, OPEN)
                    self._content(out, self._buffer[: len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    return out
                self._content(out, self._buffer[:start])
                self._buffer, self._inside = self._buffer[start + len(OPEN):], True
                continue
            if self._streaming is None:
                self._start_call(out)
            end = self._buffer.find(CLOSE)
            if end < 0:
                if self._streaming is not None:
                    self._more_arguments(out, _open_arguments(self._buffer))
                return out
            block, self._buffer, self._inside = self._buffer[:end], self._buffer[end + len(CLOSE):], False
            if self._streaming is not None:
                self._more_arguments(out, _closed_arguments(block))
                self._streaming = None
                continue
            call = self._whole_call(block)
            if call is None:
                self._content(out, OPEN + block + CLOSE)
                continue
            self._pending_space = ""  # whitespace before a call is not content
            out.append(CallDelta(len(self.calls) - 1, call.arguments, call))

    def finish(self) -> list[str | CallDelta]:
        """What is still held back when the answer ends: the rest of a streamed call's arguments,
        or an unclosed block as content; whitespace after the last call is dropped."""
        out: list[str | CallDelta] = []
        if self._streaming is not None:
            self._more_arguments(out, self._buffer)
            self._streaming = None
        else:
            self._content(out, (OPEN if self._inside else "") + self._buffer)
        self._buffer, self._inside = "", False
        if not self.calls and self._pending_space:
            out.append(self._pending_space)
            self.content += self._pending_space
            self._pending_space = ""
        return out

    def _start_call(self, out: list) -> None:
        head = _HEAD.match(self._buffer)
        if head is None or json.loads(head.group(1)) not in self.tool_names:
            return
        self._pending_space = ""
        self._streaming = ParsedCall(f"call_{uuid.uuid4().hex[:24]}", json.loads(head.group(1)))
        self.calls.append(self._streaming)
        self._buffer = self._buffer[head.end():]
        out.append(CallDelta(len(self.calls) - 1, "", self._streaming))

    def _more_arguments(self, out: list, arguments: str) -> None:
        """Give out what `arguments` (the call's text so far) adds to what was given."""
        piece = arguments[len(self._streaming.arguments):]
        if piece:
            self._streaming.arguments += piece
            out.append(CallDelta(len(self.calls) - 1, piece))

    def _content(self, out: list, content: str) -> None:
        """Content to give out now: trailing whitespace waits until something other than a call
        follows it."""
        body = content.rstrip()
        if body:
            text = self._pending_space + body
            self.content += text
            out.append(text)
            self._pending_space = ""
        self._pending_space += content[len(body):]

    def _whole_call(self, block: str) -> ParsedCall | None:
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


def _open_arguments(text: str) -> str:
    """The arguments written so far in an unclosed block's `text` (after its head): all of it
    but what may still be the block's closing brace and the start of CLOSE."""
    text = text[: len(text) - _partial_end(text, CLOSE)].rstrip()
    return text.removesuffix("}")


def _closed_arguments(block: str) -> str:
    """The arguments of a closed block (after its head): up to its closing brace."""
    block = block.rstrip()
    return block.removesuffix("}")


def _partial_end(text: str, marker: str) -> int:
    """How many characters at the end of `text` could be the start of `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def read_answer(text: str, tool_names: frozenset[str]) -> tuple[str, list[ParsedCall]]:
    """A whole answer's content and calls."""
    reader = ToolCallReader(tool_names)
    pieces = reader.push(text) + reader.finish()
    return "".join(piece for piece in pieces if isinstance(piece, str)), reader.calls


def tool_finish_reason(reason: str, calls: list[ParsedCall]) -> str:
    """OpenAI's finish reason of an answer that made calls and ended where it could."""
    return "tool_calls" if calls and reason == "stop" else reason
