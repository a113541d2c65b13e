"""The PNGs of `k25 bench serve --plot`: a run's latencies over time and their histogram, or
a sweep's TTFT against the offered load."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
import numpy as np  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from bench.serve_stats import RequestResult  # noqa: E402

PLAIN = FuncFormatter(lambda value, _: f"{value:g}")  # 20 rather than 2x10^1 on log axes


def plot_run(results: list[RequestResult], title: str, path: str) -> None:
    """Left: TTFT and end-to-end latency of each request by the time it was sent, failures
    marked on the time axis. Right: the TTFT and inter-token latency histograms."""
    ok = [r for r in results if r.error is None]
    failed = [r for r in results if r.error is not None]
    fig, (over_time, histogram) = plt.subplots(1, 2, figsize=(12, 4.5))
    sent = [r.started_s for r in ok]
    over_time.scatter(sent, [(r.ended_s - r.started_s) * 1000 for r in ok], s=8, label="end-to-end", color="tab:blue")
    over_time.scatter(sent, [r.ttft_s * 1000 for r in ok], s=8, label="TTFT", color="tab:orange")
    if failed:
        over_time.scatter([r.started_s for r in failed], [0] * len(failed), marker="x", color="tab:red",
                          label=f"failed ({len(failed)})", clip_on=False, zorder=3)
    over_time.set(xlabel="sent at (s)", ylabel="latency (ms)", title="latency over time")
    over_time.set_ylim(bottom=0)
    over_time.legend(loc="upper left")

    ttft = [r.ttft_s * 1000 for r in ok]
    itl = [(b - a) * 1000 for r in ok for a, b in zip(r.token_times_s, r.token_times_s[1:])]
    positive = [v for v in ttft + itl if v > 0]
    if positive:  # log-spaced bins: token gaps of a few ms and queued TTFTs of seconds on one axis
        bins = np.geomspace(min(positive), max(positive) * 1.001, 50)
        for values, label, color in ((ttft, "TTFT", "tab:orange"), (itl, "inter-token", "tab:green")):
            if values:
                histogram.hist(values, bins=bins, alpha=0.6, label=label, color=color)
        histogram.set_xscale("log")
        histogram.xaxis.set_major_formatter(PLAIN)
        histogram.legend()
    histogram.set(xlabel="ms", ylabel="count", title="TTFT and inter-token latency")
    _save(fig, title, path)


def plot_sweep(levels: list[dict], ttft_limit_ms: float, path: str) -> None:
    """Left: TTFT p50 and p99 by offered QPS, with the limit. Right: achieved against offered."""
    fig, (latency, throughput) = plt.subplots(1, 2, figsize=(12, 4.5))
    offered = [level["qps"] for level in levels]
    for q, marker in (("p50", "o"), ("p99", "s")):
        points = [(level["qps"], level["ttft_ms"][q]) for level in levels if level["ttft_ms"][q] is not None]
        latency.plot([x for x, _ in points], [y for _, y in points], marker=marker, label=f"TTFT {q}")
    latency.axhline(ttft_limit_ms, color="tab:red", linestyle="--", label=f"{ttft_limit_ms:g} ms")
    latency.set(xlabel="offered QPS", ylabel="ms", title="time to first token", yscale="log")
    latency.yaxis.set_major_formatter(PLAIN)
    latency.yaxis.set_minor_formatter(PLAIN)
    latency.legend()
    throughput.plot(offered, [level["requests_per_s"] for level in levels], marker="o", label="completed req/s")
    throughput.plot(offered, offered, linestyle=":", color="gray", label="offered")
    throughput.set(xlabel="offered QPS", ylabel="requests/s", title="throughput")
    throughput.legend()
    _save(fig, "serving sweep", path)


def _save(fig, title: str, path: str) -> None:
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
