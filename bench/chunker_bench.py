"""`k25 bench chunk`: the chunker's speed (tokenizer included) and its clause split rate,
side by side with fixed windows of the same size and overlap."""

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
    chunks_per_s: float
    seconds: float  # the best repeat, all documents


@dataclass(frozen=True)
class SplitRates:
    chunk_size: int
    clauses: int
    clauses_that_fit: int  # clauses (with their line breaks) of at most chunk_size tokens
    fixed_split_rate: float
    k25_split_rate: float
    fixed_split_rate_of_fitting: float
    k25_split_rate_of_fitting: float
    fixed_chunks: int
    k25_chunks: int


@dataclass(frozen=True)
class ChunkBenchResult:
    documents: int
    characters: int
    utf8_bytes: int
    tokens: int
    speed_params: dict
    k25_speed: Speed
    fixed_speed: Speed
    split_rates: list[SplitRates]

    def as_dict(self) -> dict:
        return asdict(self)


def _best_time(run: Callable[[], int], repeats: int, tick: Callable[[], None]) -> tuple[float, int]:
    """The fastest of `repeats` runs, and the chunk count a run produced."""
    best, chunks = float("inf"), 0
    for _ in range(repeats):
        started = time.perf_counter()
        chunks = run()
        best = min(best, time.perf_counter() - started)
        tick()
    return best, chunks


def _speed(seconds: float, utf8_bytes: int, chunks: int) -> Speed:
    return Speed(utf8_bytes / 1e6 / seconds, chunks / seconds, seconds)


def bench_chunker(
    tokenizer: Tokenizer, texts: list[str], speed_params: ChunkParams, chunk_sizes: list[int], repeats: int,
    tick: Callable[[], None] = lambda: None,
) -> ChunkBenchResult:
    """`tick` is called after each timed repeat and each chunk size measured (2 × repeats + sizes)."""
    chunker = Chunker(tokenizer)
    utf8_bytes = sum(len(t.encode("utf-8")) for t in texts)

    def run_k25() -> int:
        return sum(len(chunker.chunk(text, speed_params).chunks) for text in texts)

    def run_fixed() -> int:
        return sum(len(fixed_windows(tokenize(tokenizer, t).offsets, len(t), speed_params)) for t in texts)

    k25_seconds, k25_chunks = _best_time(run_k25, repeats, tick)
    fixed_seconds, fixed_chunks = _best_time(run_fixed, repeats, tick)

    tokenized = [tokenize(tokenizer, text) for text in texts]
    rates = []
    for chunk_size in chunk_sizes:
        rates.append(_split_rates(chunker, tokenized, ChunkParams(chunk_size, speed_params.overlap_ratio, speed_params.semantic_threshold)))
        tick()
    return ChunkBenchResult(
        documents=len(texts),
        characters=sum(len(t) for t in texts),
        utf8_bytes=utf8_bytes,
        tokens=sum(len(t.offsets) for t in tokenized),
        speed_params=asdict(speed_params),
        k25_speed=_speed(k25_seconds, utf8_bytes, k25_chunks),
        fixed_speed=_speed(fixed_seconds, utf8_bytes, fixed_chunks),
        split_rates=rates,
    )


def _split_rates(chunker: Chunker, tokenized, params: ChunkParams) -> SplitRates:
    clause_count = fit_count = fixed_split = k25_split = fixed_fit_split = k25_fit_split = fixed_chunks = k25_chunks = 0
    for doc in tokenized:
        found = clauses(doc.text)
        starts = [start for start, _ in doc.offsets]
        fits = [c for c in found if unit_tokens(c, starts) <= params.chunk_size]
        ours = chunker.chunk(doc.text, params).chunks
        fixed = fixed_windows(doc.offsets, len(doc.text), params)
        clause_count, fit_count = clause_count + len(found), fit_count + len(fits)
        fixed_split, k25_split = fixed_split + count_split(found, fixed), k25_split + count_split(found, ours)
        fixed_fit_split += count_split(fits, fixed)
        k25_fit_split += count_split(fits, ours)
        fixed_chunks, k25_chunks = fixed_chunks + len(fixed), k25_chunks + len(ours)

    def rate(count: int, of: int) -> float:
        return count / of if of else 0.0

    return SplitRates(
        chunk_size=params.chunk_size, clauses=clause_count, clauses_that_fit=fit_count,
        fixed_split_rate=rate(fixed_split, clause_count), k25_split_rate=rate(k25_split, clause_count),
        fixed_split_rate_of_fitting=rate(fixed_fit_split, fit_count), k25_split_rate_of_fitting=rate(k25_fit_split, fit_count),
        fixed_chunks=fixed_chunks, k25_chunks=k25_chunks,
    )
