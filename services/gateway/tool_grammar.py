"""The grammar a tool-calling answer must follow, for the engine's constrained decoding
(llguidance's Lark dialect, `%json` embedding each call's schema).

A call is `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (the form of the
Hermes, Qwen and SmolLM templates, and of K25's default tool prompt); calls follow each
other on new lines. `required` and a named tool allow nothing but calls; `auto` allows free
text that, once it opens a call, must finish it as one of the tools."""

import json

from services.gateway.structured_fields import Tool

OPEN, CLOSE = "<tool_call>", "</tool_call>"

# calls one answer may make: a small model would otherwise repeat calls until max_tokens
MAX_PARALLEL_CALLS = 8

# free text that never opens a call, and free text up to and including the first opening
_AUTO_LEXEMES = r"""TEXT: /(.|\n)*/ & ~/(.|\n)*<tool_call>(.|\n)*/
OPEN: /(.|\n)*<tool_call>\n/ & ~/(.|\n)*<tool_call>(.|\n)*<tool_call>(.|\n)*/
"""


def call_schema(tools: list[Tool]) -> dict:
    """The JSON Schema of one call of any of `tools`: its name, then arguments valid for it."""
    options = [{
        "type": "object",
        "properties": {"name": {"const": tool.function.name}, "arguments": tool.function.parameters_schema()},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    } for tool in tools]
    return options[0] if len(options) == 1 else {"anyOf": options}


def tool_call_grammar(tools: list[Tool], parallel: bool, free_text: bool) -> str:
    """Calls of `tools` only (one, or up to MAX_PARALLEL_CALLS when `parallel`), or with
    `free_text` an answer in text that may end in such calls."""
    # {m,n}: a repetition both llguidance releases read (vLLM's pins an older one than K25's engine)
    more = f'("\\n{OPEN}\\n" call_body "\\n{CLOSE}"){{0,{MAX_PARALLEL_CALLS - 1}}}' if parallel else ""
    body = f"call_body: %json {json.dumps(call_schema(tools), separators=(',', ':'))}\n"
    if free_text:
        return f'start: TEXT | OPEN call_body "\\n{CLOSE}" {more}\n{_AUTO_LEXEMES}{body}'
    return f'start: "{OPEN}\\n" call_body "\\n{CLOSE}" {more}\n{body}'
