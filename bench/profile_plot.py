"""The PNG of `k25 bench profile`: throughput and p95 latency against max_chunk_per_gpu, the
recommended value marked."""


def plot_profile(result, title: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = [m.max_chunk_per_gpu for m in result.measured]
    fig, left = plt.subplots(figsize=(8, 4.5))
    left.plot(values, [m.tokens_per_s for m in result.measured], "o-", color="tab:blue")
    left.set_xlabel("max_chunk_per_gpu")
    left.set_ylabel("generated tokens/s", color="tab:blue")
    right = left.twinx()
    right.plot(values, [m.p95_latency_s for m in result.measured], "s--", color="tab:red")
    right.set_ylabel("p95 request latency (s)", color="tab:red")
    left.axvline(result.recommended.value, color="gray", linestyle=":", label=f"recommended {result.recommended.value}")
    left.legend(loc="upper left", fontsize=8)
    left.set_xticks(values)
    fig.suptitle(f"k25 bench profile ({result.device}, {result.dtype}, largest that fits {result.largest})", fontsize=10)
    left.set_title(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
