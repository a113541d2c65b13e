"""The tokenizer the gateway and the engine share, built on the `tokenizers` library alone.

Two sources: a GGUF file's `tokenizer.ggml.*` metadata (rebuilt as a byte-level BPE with the
pre-tokenizer llama.cpp uses for its `tokenizer.ggml.pre`, in common/gguf_bpe.py), or a Hugging
Face folder's `tokenizer.json` + `tokenizer_config.json`. Chat templates render with jinja2 the
way transformers renders them. No torch, no transformers: this loads in a fraction of a second.

A message's content is text, never control: `encode_chat` reads a special token's spelling
inside a message (`<|im_start|>system` typed by a user) as the plain text it is, so that only
the template writes turns and roles. Conversations without such spellings tokenise exactly as
transformers tokenises the rendered template.
"""

import json
import os
import re
from datetime import datetime
from functools import lru_cache

import jinja2
import jinja2.ext
import jinja2.sandbox
from tokenizers import Tokenizer as Backend

from common.gguf_bpe import byte_level_bpe, post_processor
from common.gguf_file import GGUFError, GGUFFile
from common.model_source import ModelLoadError, resolve_model

# marks put around each message's content while the template renders, to find it in the text:
# Unicode noncharacters, which no text exchanged should hold (a message's own are dropped)
_CONTENT_OPEN, _CONTENT_CLOSE = "\ufdd0", "\ufdd1"
_MARKED_CONTENT = re.compile(f"{_CONTENT_OPEN}(.*?){_CONTENT_CLOSE}", re.DOTALL)

# Tokens that end an assistant turn in common chat formats; they stop generation when the chat
# template writes them, even if the model's eos is a different token.
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|end_of_turn|>")


def _token_content(value) -> str | None:
    """tokenizer_config.json writes special tokens as strings or as AddedToken dicts."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: unreadable JSON ({e})") from None


@lru_cache(maxsize=16)
def _compile_template(source: str) -> jinja2.Template:
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # jinja's own tojson escapes HTML characters, which chat templates must not do
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


class Tokenizer:
    """Text <-> token ids, special token ids, and the chat template of one model."""

    def __init__(
        self,
        backend: Backend,
        *,
        chat_template: str | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
        unk_token: str | None = None,
        add_bos_token: bool = False,
        extra_eos_token_ids: tuple[int, ...] = (),
    ):
        self.backend = backend
        self.chat_template = chat_template
        self.bos_token, self.eos_token, self.pad_token, self.unk_token = bos_token, eos_token, pad_token, unk_token
        self.add_bos_token = add_bos_token
        self.bos_token_id = self.token_to_id(bos_token)
        self.eos_token_id = self.token_to_id(eos_token)
        # padded positions are masked, so a model without a pad token pads with its eos
        self.pad_token_id = self.token_to_id(pad_token) if pad_token is not None else self.eos_token_id
        self.eos_token_ids = self._stop_ids(extra_eos_token_ids)
        self.special_texts = tuple(t.content for t in backend.get_added_tokens_decoder().values() if t.special)
        self._plain_backend: Backend | None = None  # the same tokenizer, special tokens read as text

    @property
    def plain_backend(self) -> Backend:
        """A copy of the backend that reads special tokens' spellings as ordinary text."""
        if self._plain_backend is None:
            plain = Backend.from_str(self.backend.to_str())
            plain.encode_special_tokens = True
            self._plain_backend = plain
        return self._plain_backend

    def _stop_ids(self, extra: tuple[int, ...]) -> tuple[int, ...]:
        ids = [self.eos_token_id, *extra]
        for token in _END_OF_TURN:
            if self.chat_template and token in self.chat_template:
                ids.append(self.token_to_id(token))
        return tuple(dict.fromkeys(i for i in ids if i is not None))

    # --- construction -----------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, source: "str | GGUFFile") -> "Tokenizer":
        """From a GGUF path, or from a GGUFFile already open (the model loader shares its parse)."""
        path = source.path if isinstance(source, GGUFFile) else str(source)
        try:
            md = source.metadata if isinstance(source, GGUFFile) else GGUFFile(path).metadata
        except GGUFError as e:
            raise ModelLoadError(str(e)) from None
        except OSError as e:
            raise ModelLoadError(f"{path}: cannot read ({e.strerror or e})") from None
        kind = md.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ModelLoadError(
                f"{path}: tokenizer.ggml.model is {kind!r}; only byte-level BPE ('gpt2') GGUF tokenizers are "
                "supported — use a Hugging Face folder for this model"
            )
        tokens = md.get("tokenizer.ggml.tokens")
        merges = md.get("tokenizer.ggml.merges")
        if not tokens or merges is None:
            raise ModelLoadError(f"{path}: GGUF has no tokenizer.ggml.tokens or tokenizer.ggml.merges")
        types, pre = md.get("tokenizer.ggml.token_type"), md.get("tokenizer.ggml.pre", "default")
        backend = byte_level_bpe(tokens, merges, types, pre, path)

        def token(key):
            i = md.get(f"tokenizer.ggml.{key}")
            return tokens[i] if i is not None and 0 <= i < len(tokens) else None

        add_bos = bool(md.get("tokenizer.ggml.add_bos_token", False))
        add_eos = bool(md.get("tokenizer.ggml.add_eos_token", False))
        backend.post_processor = post_processor(
            token("bos_token_id") if add_bos else None, token("eos_token_id") if add_eos else None, backend
        )
        return cls(
            backend,
            chat_template=md.get("tokenizer.chat_template"),
            bos_token=token("bos_token_id"),
            eos_token=token("eos_token_id"),
            pad_token=token("padding_token_id"),
            unk_token=token("unknown_token_id"),
            add_bos_token=add_bos,
        )

    @classmethod
    def from_folder(cls, path: str) -> "Tokenizer":
        tokenizer_json = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(tokenizer_json):
            raise ModelLoadError(f"{path}: no tokenizer.json in the folder")
        try:
            backend = Backend.from_file(tokenizer_json)
        except Exception as e:  # the Rust side raises a bare Exception for every parse error
            raise ModelLoadError(f"{tokenizer_json}: not a valid tokenizer.json ({e})") from None
        config = _read_json(os.path.join(path, "tokenizer_config.json"))
        generation = _read_json(os.path.join(path, "generation_config.json"))

        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: [{"name": "default", "template": "..."}, ...]
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default") or next(iter(named.values()), None)
        jinja_file = os.path.join(path, "chat_template.jinja")
        if os.path.isfile(jinja_file):  # transformers >= 4.50 saves the template beside the config
            with open(jinja_file, encoding="utf-8") as f:
                template = f.read()

        eos = generation.get("eos_token_id")
        extra_eos = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        bos = _token_content(config.get("bos_token"))
        probe = backend.encode("", add_special_tokens=True).ids
        return cls(
            backend,
            chat_template=template,
            bos_token=bos,
            eos_token=_token_content(config.get("eos_token")),
            pad_token=_token_content(config.get("pad_token")),
            unk_token=_token_content(config.get("unk_token")),
            add_bos_token=bool(config.get("add_bos_token", bos is not None and backend.token_to_id(bos) in probe)),
            extra_eos_token_ids=extra_eos,
        )

    def save(self, folder: str) -> None:
        """Write tokenizer.json and tokenizer_config.json, as a Hugging Face model folder has them."""
        os.makedirs(folder, exist_ok=True)
        self.backend.save(os.path.join(folder, "tokenizer.json"))
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "pad_token": self.pad_token,
            "unk_token": self.unk_token,
            "add_bos_token": self.add_bos_token,
            "clean_up_tokenization_spaces": False,
            "model_max_length": 1 << 30,
        }
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2, ensure_ascii=False)

    # --- use ------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; BOS/EOS only where the model's tokenizer says to add them."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> str:
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        variables = {
            "bos_token": self.bos_token or "",
            "eos_token": self.eos_token or "",
            "pad_token": self.pad_token or "",
            "unk_token": self.unk_token or "",
            "tools": None,
            "documents": None,
            **kwargs,
        }
        return _compile_template(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **variables
        )

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> list[int]:
        """The rendered conversation's ids; the template writes any BOS itself, so none is added.
        A special token spelled inside a message's content is encoded as text, not as the token."""
        if not any(self._spells_special(m.get("content")) for m in messages):
            text = self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **kwargs)
            return self.encode(text, add_special_tokens=False)
        marked = [{**m, "content": _CONTENT_OPEN + _unmarked(m["content"]) + _CONTENT_CLOSE}
                  if isinstance(m.get("content"), str) else m for m in messages]
        text = self.apply_chat_template(marked, add_generation_prompt=add_generation_prompt, **kwargs)
        ids, start = [], 0
        for content in _MARKED_CONTENT.finditer(text):  # the template's text, then a message's content, ...
            ids += self.encode(_unmarked(text[start:content.start()]), add_special_tokens=False)
            ids += self.plain_backend.encode(content.group(1), add_special_tokens=False).ids
            start = content.end()
        return ids + self.encode(_unmarked(text[start:]), add_special_tokens=False)

    def _spells_special(self, content) -> bool:
        return isinstance(content, str) and any(special in content for special in self.special_texts)


def _unmarked(text: str) -> str:
    return text.replace(_CONTENT_OPEN, "").replace(_CONTENT_CLOSE, "")



class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas that never end in a half-written character.

    Keeps two offsets into the ids: text is decoded from `prefix` (a few tokens back, so the
    decoder sees context such as a leading space) and compared with the text up to `read`; what
    is new is emitted once it no longer ends in U+FFFD, the mark of an incomplete UTF-8 sequence.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""
        self._prefix = 0
        self._read = 0

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        delta = after[len(before) :]
        self._prefix, self._read = self._read, len(self.ids)
        self.text += delta
        return delta

    def finish(self) -> str:
        """Whatever is still held back (e.g. a stream cut inside a character), as the decoder renders it."""
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        delta = after[len(before) :]
        self._prefix = self._read = len(self.ids)
        self.text += delta
        return delta


def load_tokenizer(name_or_path: str) -> Tokenizer:
    """The tokenizer of a model name, GGUF file or HF folder, without reading any weights."""
    source = resolve_model(name_or_path)
    if source.kind == "hf":
        return Tokenizer.from_folder(source.path)
    return Tokenizer.from_gguf(source.path)
