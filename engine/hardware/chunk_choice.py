"""Which `max_chunk_per_gpu` to run with, given a curve of throughput and p95 latency over
candidate values: a pure decision shared by `k25 bench profile` (a measured curve) and the
engine's `--max-chunk-per-gpu auto` (a curve modelled from what it knows at start).

The rule: among the values that fit, the smallest whose throughput is within
THROUGHPUT_TOLERANCE of the best and whose p95 latency is within LATENCY_TOLERANCE of the best.
A larger value only holds KV that the workload does not use (memory taken from weights,
activations and other engines) for a gain inside the tolerance, which on a noisy machine is
noise. If no value is within both, the smallest within the throughput tolerance wins and the
reason says how far its p95 is from the best.

`auto` cannot measure at start (a profile takes minutes), so it models the curve from the
requests it expects: at `v` chunks, `v // expected_chunks` requests of `expected_chunks` chunks
fit in the KV cache at once, at most `max_num_seqs`; it counts their decode throughput as
proportional to that number (the decode step is memory-bound on a GPU: a bigger batch costs
little more) and the p95 of a burst of `max_num_seqs` requests as proportional to the waves it
takes. The rule then picks the smallest multiple of `expected_chunks` that runs `max_num_seqs`
such requests at once, or, if that does not fit, the largest multiple that does. Where compute
saturates before that (a CPU), only a measured profile finds the smaller value."""

from collections.abc import Sequence
from dataclasses import dataclass

from engine.base.errors import EngineConfigError

AUTO = "auto"
THROUGHPUT_TOLERANCE = 0.05  # within 5% of the best throughput
LATENCY_TOLERANCE = 0.10  # within 10% of the best p95


@dataclass(frozen=True)
class CurvePoint:
    max_chunk_per_gpu: int
    throughput: float  # measured: generated tokens/s; modelled: requests decoding at once
    p95_latency: float  # measured: seconds; modelled: waves of a burst


@dataclass(frozen=True)
class ChunkChoice:
    value: int
    reason: str


def recommend(points: Sequence[CurvePoint], largest: int, throughput_tolerance: float = THROUGHPUT_TOLERANCE,
              latency_tolerance: float = LATENCY_TOLERANCE) -> ChunkChoice:
    """The smallest value that fits (<= largest) within both tolerances of the best; raises
    ValueError if no point fits or none has any throughput."""
    if throughput_tolerance < 0 or latency_tolerance < 0:
        raise ValueError("the tolerances must be at least 0")
    fitting = sorted((p for p in points if 1 <= p.max_chunk_per_gpu <= largest and p.throughput > 0),
                     key=lambda p: p.max_chunk_per_gpu)
    if not fitting:
        raise ValueError(f"no candidate with any throughput fits (the largest that fits is {largest})")
    best_throughput = max(p.throughput for p in fitting)
    best_latency = min(p.p95_latency for p in fitting)
    fast = [p for p in fitting if p.throughput >= (1 - throughput_tolerance) * best_throughput]
    both = [p for p in fast if p.p95_latency <= (1 + latency_tolerance) * best_latency]
    chosen = (both or fast)[0]
    rule = (f"the smallest value with throughput within {throughput_tolerance:.0%} of the best "
            f"({best_throughput:.4g}) and p95 within {latency_tolerance:.0%} of the best ({best_latency:.4g})")
    if both:
        return ChunkChoice(chosen.max_chunk_per_gpu, f"{rule}: throughput {chosen.throughput:.4g}, p95 {chosen.p95_latency:.4g}")
    over = chosen.p95_latency / best_latency - 1
    return ChunkChoice(chosen.max_chunk_per_gpu, f"{rule}: none holds both, so the smallest within the throughput "
                       f"tolerance ({chosen.throughput:.4g}); its p95 {chosen.p95_latency:.4g} is {over:.0%} above the best")


def modelled_curve(largest: int, expected_chunks: int, max_num_seqs: int) -> list[CurvePoint]:
    """What `auto` knows at start, as a curve over the multiples of `expected_chunks` that fit."""
    points = []
    for value in range(expected_chunks, largest + 1, expected_chunks):
        running = min(max_num_seqs, value // expected_chunks)
        points.append(CurvePoint(value, float(running), float(-(-max_num_seqs // running))))
        if running == max_num_seqs:
            break  # larger values hold only idle KV
    return points


def auto_max_chunk_per_gpu(largest: int, expected_chunks: int, max_num_seqs: int) -> ChunkChoice:
    """`--max-chunk-per-gpu auto`: the rule over the modelled curve; raises EngineConfigError if
    not even one expected request fits."""
    if expected_chunks < 1 or max_num_seqs < 1:
        raise EngineConfigError("the expected chunks per request and max_num_seqs must be at least 1")
    if largest < expected_chunks:
        raise EngineConfigError(f"max_chunk_per_gpu auto: not one request of {expected_chunks} chunks fits; "
                                f"the largest max_chunk_per_gpu that fits is {largest}")
    choice = recommend(modelled_curve(largest, expected_chunks, max_num_seqs), largest)
    running = min(max_num_seqs, choice.value // expected_chunks)
    return ChunkChoice(choice.value, f"auto: {running} requests of {expected_chunks} chunks at once (max_num_seqs "
                       f"{max_num_seqs}, {largest} chunks fit); measure with `k25 bench profile` for a smaller value")
