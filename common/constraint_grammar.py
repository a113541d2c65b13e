"""A structured-output constraint (the wire's Constraint) in llguidance's terms, shared by the
gateway, which checks that it compiles, and the engine, which compiles it to mask tokens.
llguidance is a dependency of the shared base: the constraint means the same on both sides."""

import llguidance

from common.tokenizer import Tokenizer


def grammar_of(kind: str, text: str) -> str:
    """The constraint `kind` ("json_schema", "regex" or "lark") with its `text` as an
    llguidance grammar; ValueError when it is not even that (e.g. a schema that is not JSON)."""
    if kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(text)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(text)
    if kind == "lark":
        return llguidance.LLMatcher.grammar_from_lark(text)
    raise ValueError(f"unknown constraint kind {kind!r}")


def compile_error(grammar: str, tokenizer: "llguidance.LLTokenizer | None" = None) -> str | None:
    """llguidance's reason the grammar does not compile, or None when it does."""
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
    return messages[0] if is_error else None


def ll_tokenizer_of(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    """llguidance's view of a K25 tokenizer: its tokenizers JSON, and the token that ends an answer."""
    return llguidance.LLTokenizer(tokenizer.backend.to_str(), n_vocab=tokenizer.vocab_size,
                                  eos_token=tokenizer.eos_token_id)
