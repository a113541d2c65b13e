"""The statistics of `k25 bench serve` (pure): each request's outcome and the figures of a run."""

from collections import Counter
from dataclasses import dataclass, field

PERCENTILES = (50, 95, 99)


@dataclass
class RequestResult:
    send_at_s: float  # when the schedule said to send it
    started_s: float  # when it was sent
    ended_s: float
    token_times_s: list[float] = field(default_factory=list)  # each token event, from started_s
    output_tokens: int = 0
    error: str | None = None  # None for success; else its kind: "503", "stream:engine_lost", "ReadTimeout", ...
    error_message: str = ""
    prompt_tokens: int = 0  # as the server's usage reported them
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens; None when not reported
    valid: bool | None = None  # a structured answer that holds (serve_structured.is_valid); None: not checked

    @property
    def ttft_s(self) -> float | None:
        return self.token_times_s[0] if self.token_times_s else None


def percentile(values, q: float) -> float:
    """The q-th percentile by linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_ms(values_s) -> dict:
    """p50/p95/p99, mean and max in milliseconds (None for each when there are no values)."""
    values = [v * 1000.0 for v in values_s]
    stats = {f"p{q}": percentile(values, q) if values else None for q in PERCENTILES}
    stats["mean"] = sum(values) / len(values) if values else None
    stats["max"] = max(values) if values else None
    stats["count"] = len(values)
    return stats


def max_overlap(intervals) -> int:
    """The most (start, end) intervals open at one moment; one that ends as another starts
    does not overlap it."""
    events = sorted([(end, -1) for _, end in intervals] + [(start, 1) for start, _ in intervals])
    open_now = peak = 0
    for _, change in events:
        open_now += change
        peak = max(peak, open_now)
    return peak


def summarize(results: list[RequestResult], wall_s: float) -> dict:
    """The figures of one run: latencies of the requests that succeeded, throughput over the
    run's wall time, and the failures by kind (503s also on their own)."""
    ok = [r for r in results if r.error is None]
    errors = Counter(r.error for r in results if r.error is not None)
    examples = {}
    for r in results:
        if r.error is not None:
            examples.setdefault(r.error, r.error_message)
    output_tokens = sum(r.output_tokens for r in ok)
    return {
        "requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": dict(sorted(errors.items())),
        "errors_503": errors.get("503", 0),
        "error_examples": dict(sorted(examples.items())),
        "wall_s": wall_s,
        "requests_per_s": len(ok) / wall_s if wall_s > 0 else 0.0,
        "output_tokens": output_tokens,
        "output_tokens_per_s": output_tokens / wall_s if wall_s > 0 else 0.0,
        "ttft_ms": latency_ms([r.ttft_s for r in ok]),
        "itl_ms": latency_ms([b - a for r in ok for a, b in zip(r.token_times_s, r.token_times_s[1:])]),
        "e2e_ms": latency_ms([r.ended_s - r.started_s for r in ok]),
        "send_lag_ms": latency_ms([r.started_s - r.send_at_s for r in results]),
        "cached_share": cached_share(ok),
        "valid_share": valid_share(results),
    }


def valid_share(results: list[RequestResult]) -> float | None:
    """The share of checked requests whose structured answer holds (a failed request does not);
    None when no answer was checked."""
    checked = [r for r in results if r.valid is not None or r.error is not None]
    if not any(r.valid is not None for r in results):
        return None
    return sum(bool(r.valid) for r in checked) / len(checked)


def cached_share(results: list[RequestResult]) -> float | None:
    """The share of prompt tokens the server reported cached; None when it reported none."""
    reported = [r for r in results if r.cached_tokens is not None]
    prompt = sum(r.prompt_tokens for r in reported)
    return sum(r.cached_tokens for r in reported) / prompt if reported and prompt else None


def holds(summary: dict, ttft_limit_ms: float) -> bool:
    """A load level is held when every request succeeded with p99 TTFT under the limit."""
    p99 = summary["ttft_ms"]["p99"]
    return summary["failed"] == 0 and p99 is not None and p99 < ttft_limit_ms


def highest_qps_held(levels: list[dict], ttft_limit_ms: float) -> float | None:
    """The highest offered QPS among `levels` (each a summary with its "qps") that holds."""
    held = [level["qps"] for level in levels if holds(level, ttft_limit_ms)]
    return max(held) if held else None
