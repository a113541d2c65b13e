"""The byte-level BPE a GGUF file's `tokenizer.ggml.*` metadata describes, rebuilt with the
`tokenizers` library: its vocabulary and merges, the pre-tokenizer llama.cpp uses for its
`tokenizer.ggml.pre`, and the BOS/EOS it says to add (common/tokenizer.py wraps it)."""

import warnings
from functools import lru_cache

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend

# llama.cpp's token types (tokenizer.ggml.token_type)
_CONTROL, _USER_DEFINED = 3, 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt2_pre():
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2():
    # llama.cpp splits every \p{N} character off first, then applies the GPT-2 regex to the rest;
    # that is StarCoder's (and SmolLM's) tokenizer.json: Digits(individual) + ByteLevel.
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2_pre()])


def _split_then_bytes(pattern: str):
    def build():
        split = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
        return pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])

    return build


# tokenizer.ggml.pre -> (pre-tokenizer builder, BPE ignore_merges, NFC normalizer)
_PRE_TOKENIZERS = {
    "default": (_gpt2_pre, False, False),
    "gpt-2": (_gpt2_pre, False, False),
    "gpt2": (_gpt2_pre, False, False),
    **{
        name: (_digits_then_gpt2, False, False)
        for name in ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")
    },
    **{
        name: (_split_then_bytes(_LLAMA3_SPLIT), True, False)
        for name in ("llama-bpe", "llama3", "llama-v3", "smaug-bpe", "dbrx", "falcon3", "pixtral")
    },
    "qwen2": (_split_then_bytes(_QWEN2_SPLIT), False, True),
    "deepseek-r1-qwen": (_split_then_bytes(_QWEN2_SPLIT), False, True),
}


@lru_cache(maxsize=1)
def _byte_spelling() -> dict[int, str]:
    """GPT-2's byte -> printable character table that byte-level vocabularies are written in."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    spelling, extra = {}, 0
    for b in range(256):
        if b in printable:
            spelling[b] = chr(b)
        else:
            spelling[b] = chr(256 + extra)
            extra += 1
    return spelling


def _respell(token: str, alphabet: frozenset) -> str:
    """A token llama.cpp stored in plain text (e.g. with real spaces) spelled in the byte alphabet."""
    if set(token) <= alphabet:
        return token
    spelling = _byte_spelling()
    return "".join(spelling[b] for b in token.encode("utf-8"))


def byte_level_bpe(tokens: list[str], merges: list[str], types, pre: str | None, path: str) -> Backend:
    """The BPE a GGUF's vocabulary describes, splitting text the way llama.cpp does for `pre`."""
    if pre not in _PRE_TOKENIZERS:
        warnings.warn(f"{path}: unknown tokenizer.ggml.pre {pre!r}; splitting text the GPT-2 way", stacklevel=3)
    build_pre, ignore_merges, nfc = _PRE_TOKENIZERS.get(pre, _PRE_TOKENIZERS["default"])

    alphabet = frozenset(_byte_spelling().values())
    vocab = {_respell(token, alphabet): i for i, token in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    backend = Backend(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, ignore_merges=ignore_merges))
    backend.pre_tokenizer = build_pre()
    backend.decoder = decoders.ByteLevel()
    if nfc:
        backend.normalizer = normalizers.NFC()
    if types is not None:
        # a control token spelled outside the byte alphabet is a mislabel; adding it would grow the vocabulary
        special = [t for t, k in zip(tokens, types) if k == _CONTROL and set(t) <= alphabet]
        user = [t for t, k in zip(tokens, types) if k == _USER_DEFINED and set(t) <= alphabet]
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
        backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
    return backend


def post_processor(bos: str | None, eos: str | None, backend: Backend):
    """Adds BOS/EOS around every encoded text, when the GGUF says to."""
    if bos is None and eos is None:
        return processors.ByteLevel(trim_offsets=False)

    def sequence(piece: str, type_id: int) -> str:
        return " ".join(f"{t}:{type_id}" for t in (bos, piece, eos) if t is not None)

    specials = [(t, backend.token_to_id(t)) for t in dict.fromkeys(t for t in (bos, eos) if t is not None)]
    return processors.TemplateProcessing(
        single=sequence("$A", 0), pair=f"{sequence('$A', 0)} {sequence('$B', 1)}", special_tokens=specials
    )
