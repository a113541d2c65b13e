"""A conversation with tools as the model's chat template receives it.

A template that renders tools itself (it reads the `tools` variable, as Qwen's and Hermes'
do) gets them, and the history in Hugging Face's shape: assistant `tool_calls` with their
arguments as objects, `tool` messages. A template that does not (SmolLM2's) gets K25's
default tool prompt in the system message, the assistant's calls written as the
`<tool_call>` blocks it asks for, and each run of tool results as one user turn of
`<tool_response>` blocks."""

import json

from services.gateway.tool_grammar import CLOSE, OPEN

DEFAULT_TOOL_PROMPT = """You can call functions to answer. They are described below as JSON Schemas, one per line:
<tools>
{tools}
</tools>
To call a function, write one block per call, each holding a JSON object with the function's "name" and its "arguments":
{open}
{{"name": "function name", "arguments": {{"argument": "value"}}}}
{close}
Results come back in <tool_response></tool_response> blocks."""

CHOICE_HINTS = {
    "auto": "Call a function only when it helps; otherwise answer in plain text.",
    "required": "Answer with one or more function calls.",
}


def template_renders_tools(chat_template: str | None) -> bool:
    return bool(chat_template) and "tools" in chat_template


def tool_messages(messages: list[dict], tools: list[dict], choice_hint: str, native: bool) -> list[dict]:
    """`messages` (OpenAI's shape, roles already mapped to the template's) ready for the
    template; `native`: the template renders `tools` itself. Without tools, only the history's
    calls and results are written out."""
    if native:
        return [_hf_message(m) for m in messages]
    prompt = None if not tools else DEFAULT_TOOL_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools),
                                        open=OPEN, close=CLOSE) + "\n" + choice_hint
    rendered: list[dict] = []
    for message in messages:
        if message["role"] == "tool":
            block = f"<tool_response>\n{message.get('content') or ''}\n</tool_response>"
            if rendered and rendered[-1].get("tool_results"):
                rendered[-1]["content"] += "\n" + block
            else:
                rendered.append({"role": "user", "content": block, "tool_results": True})
        elif message["role"] == "assistant" and message.get("tool_calls"):
            blocks = [f"{OPEN}\n{json.dumps(_call_object(c), ensure_ascii=False)}\n{CLOSE}" for c in message["tool_calls"]]
            rendered.append({"role": "assistant", "content": "\n".join(filter(None, [message.get("content"), *blocks]))})
        else:
            rendered.append({"role": message["role"], "content": message.get("content") or ""})
    rendered = [{"role": m["role"], "content": m["content"]} for m in rendered]
    if prompt is None:
        return rendered
    if rendered and rendered[0]["role"] == "system":
        rendered[0]["content"] = f"{rendered[0]['content']}\n\n{prompt}"
    else:
        rendered.insert(0, {"role": "system", "content": prompt})
    return rendered


def _call_object(call: dict) -> dict:
    return {"name": call["function"]["name"], "arguments": _arguments(call["function"]["arguments"])}


def _arguments(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def _hf_message(message: dict) -> dict:
    if message["role"] == "assistant" and message.get("tool_calls"):
        calls = [{"id": c["id"], "type": "function", "function": _call_object(c)} for c in message["tool_calls"]]
        return {**message, "tool_calls": calls}
    return message
