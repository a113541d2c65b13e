"""How long llguidance takes to compile a JSON Schema of N fields for a model's tokenizer, and
to compute its first and later token masks: `python -m bench.grammar_compile [MODEL] [FIELDS]`."""

import json
import statistics
import sys
import time

import llguidance
import llguidance.numpy

from common.constraint_grammar import compile_error, grammar_of, ll_tokenizer_of
from common.tokenizer import load_tokenizer


def wide_schema(fields: int) -> dict:
    """Integers with bounds, bounded strings and enums, in turn; every field required."""
    kinds = [{"type": "integer", "minimum": 0, "maximum": 100}, {"type": "string", "maxLength": 20},
             {"enum": ["red", "green", "blue"]}]
    properties = {f"field_{i}": kinds[i % 3] for i in range(fields)}
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def measure(model: str, fields: int, repeats: int = 20) -> dict:
    tokenizer = ll_tokenizer_of(load_tokenizer(model))
    text = json.dumps(wide_schema(fields))
    compile_ms, first_mask_ms, next_mask_ms = [], [], []
    for _ in range(repeats):
        started = time.perf_counter()
        grammar = grammar_of("json_schema", text)
        assert compile_error(grammar, tokenizer) is None
        matcher = llguidance.LLMatcher(tokenizer, grammar)
        compiled = time.perf_counter()
        mask = llguidance.numpy.allocate_token_bitmask(1, tokenizer.vocab_size)
        llguidance.numpy.fill_next_token_bitmask(matcher, mask)
        first = time.perf_counter()
        matcher.consume_tokens(tokenizer.tokenize_str('{"field_0": 1'))
        llguidance.numpy.fill_next_token_bitmask(matcher, mask)
        compile_ms.append(1e3 * (compiled - started))
        first_mask_ms.append(1e3 * (first - compiled))
        next_mask_ms.append(1e3 * (time.perf_counter() - first))
    return {"model": model, "fields": fields, "llguidance": llguidance.__version__,
            "compile_ms_median": statistics.median(compile_ms), "first_mask_ms_median": statistics.median(first_mask_ms),
            "later_mask_ms_median": statistics.median(next_mask_ms)}


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m",
                             int(sys.argv[2]) if len(sys.argv) > 2 else 50), indent=1))
