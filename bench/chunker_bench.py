"""`k25 bench chunk`: the chunker's speed (tokenizer included) and its clause split rate,
side by side with fixed windows of the same size and overlap.

The result's field names are what `k25 bench chunk --json` prints and keep their old names:
there `chunk_size` is a passage's token budget (ChunkParams.passage_tokens) and a "chunk" is
a passage (or a fixed window)."""

import time
from dataclasses import asdict, dataclass
from typing import Callable

from bench.chunker_baseline import fixed_windows
from common.tokenizer import Tokenizer
from services.chunker.boundaries import ChunkParams
from services.chunker.chunker import Chunker, tokenize
from services.chunker.clauses import clauses, count_split, unit_tokens


@dataclass(frozen=True)
class Speed:
    mb_per_s: float  # UTF-8 megabytes (1e6) of documents per second
    chunks_per_s: float  # passages (or fixed windows) per second
    seconds: float  # the best repeat, all documents


@dataclass(frozen=True)
class SplitRates:
    chunk_size: int  # the passage budget measured (passage_tokens)
    clauses: int
    clauses_that_fit: int  # clauses (with their line breaks) of at most that many tokens
    fixed_split_rate: float
    k25_split_rate: float
    fixed_split_rate_of_fitting: float
    k25_split_rate_of_fitting: float
    fixed_chunks: int  # fixed windows
    k25_chunks: int  # the chunker's passages


@dataclass(frozen=True)
class ChunkerBenchResult:
    documents: int
    characters: int
    utf8_bytes: int
    tokens: int
    speed_params: dict  # the ChunkParams of the speed measurement, as the wire names them
    k25_speed: Speed
    fixed_speed: Speed
    split_rates: list[SplitRates]

    def as_dict(self) -> dict:
        return asdict(self)


def _params_json(params: ChunkParams) -> dict:
    return {"chunk_size": params.passage_tokens, "overlap_ratio": params.overlap_ratio,
            "semantic_threshold": params.semantic_threshold}


def _best_time(run: Callable[[], int], repeats: int, tick: Callable[[], None]) -> tuple[float, int]:
    """The fastest of `repeats` runs, and the passage count a run produced."""
    best, passages = float("inf"), 0
    for _ in range(repeats):
        started = time.perf_counter()
        passages = run()
        best = min(best, time.perf_counter() - started)
        tick()
    return best, passages


def _speed(seconds: float, utf8_bytes: int, passages: int) -> Speed:
    return Speed(utf8_bytes / 1e6 / seconds, passages / seconds, seconds)


def bench_chunker(
    tokenizer: Tokenizer, texts: list[str], speed_params: ChunkParams, passage_budgets: list[int], repeats: int,
    tick: Callable[[], None] = lambda: None,
) -> ChunkerBenchResult:
    """Split rates at each of `passage_budgets` (passage_tokens values). `tick` is called after
    each timed repeat and each budget measured (2 × repeats + budgets)."""
    chunker = Chunker(tokenizer)
    utf8_bytes = sum(len(t.encode("utf-8")) for t in texts)

    def run_k25() -> int:
        return sum(len(chunker.split(text, speed_params).passages) for text in texts)

    def run_fixed() -> int:
        return sum(len(fixed_windows(tokenize(tokenizer, t).offsets, len(t), speed_params)) for t in texts)

    k25_seconds, k25_passages = _best_time(run_k25, repeats, tick)
    fixed_seconds, fixed_passages = _best_time(run_fixed, repeats, tick)

    tokenized = [tokenize(tokenizer, text) for text in texts]
    rates = []
    for budget in passage_budgets:
        rates.append(_split_rates(chunker, tokenized, ChunkParams(budget, speed_params.overlap_ratio, speed_params.semantic_threshold)))
        tick()
    return ChunkerBenchResult(
        documents=len(texts),
        characters=sum(len(t) for t in texts),
        utf8_bytes=utf8_bytes,
        tokens=sum(len(t.offsets) for t in tokenized),
        speed_params=_params_json(speed_params),
        k25_speed=_speed(k25_seconds, utf8_bytes, k25_passages),
        fixed_speed=_speed(fixed_seconds, utf8_bytes, fixed_passages),
        split_rates=rates,
    )


def _split_rates(chunker: Chunker, tokenized, params: ChunkParams) -> SplitRates:
    clause_count = fit_count = fixed_split = k25_split = fixed_fit_split = k25_fit_split = window_count = passage_count = 0
    for doc in tokenized:
        found = clauses(doc.text)
        starts = [start for start, _ in doc.offsets]
        fits = [c for c in found if unit_tokens(c, starts) <= params.passage_tokens]
        ours = chunker.split(doc.text, params).passages
        fixed = fixed_windows(doc.offsets, len(doc.text), params)
        clause_count, fit_count = clause_count + len(found), fit_count + len(fits)
        fixed_split, k25_split = fixed_split + count_split(found, fixed), k25_split + count_split(found, ours)
        fixed_fit_split += count_split(fits, fixed)
        k25_fit_split += count_split(fits, ours)
        window_count, passage_count = window_count + len(fixed), passage_count + len(ours)

    def rate(count: int, of: int) -> float:
        return count / of if of else 0.0

    return SplitRates(
        chunk_size=params.passage_tokens, clauses=clause_count, clauses_that_fit=fit_count,
        fixed_split_rate=rate(fixed_split, clause_count), k25_split_rate=rate(k25_split, clause_count),
        fixed_split_rate_of_fitting=rate(fixed_fit_split, fit_count), k25_split_rate_of_fitting=rate(k25_fit_split, fit_count),
        fixed_chunks=window_count, k25_chunks=passage_count,
    )
