"""The PNG of `k25 bench quant`: the KL each layer type adds at each width, and the presets'
KL against the bytes a decode step reads, with their decode speed beside bf16's."""


def plot_quant(result, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    labels = [f"{r.layer_type}={r.width}" for r in result.layers]
    left.barh(labels, [max(r.mean_kl, 1e-6) for r in result.layers], color="tab:blue")
    left.set_xscale("log")
    left.invert_yaxis()
    left.set_xlabel("mean KL added vs bf16 (nats/token, log scale)")
    left.set_title("one layer type quantised, the rest bf16")
    baseline = result.specs[0]
    rows = result.specs + ([result.recommended] if result.recommended else [])
    for row in rows:
        speed = ", ".join(f"b{b} {row.ratio(baseline, b):.2f}x" for b in sorted(row.tokens_per_s))
        right.scatter(row.bytes_read / 1e6, row.mean_kl, s=40)
        right.annotate(f"{row.name} ({speed})", (row.bytes_read / 1e6, row.mean_kl), textcoords="offset points",
                       xytext=(5, 5), fontsize=8)
    if result.kl_budget is not None:
        right.axhline(result.kl_budget, color="gray", linestyle="--", linewidth=1, label=f"KL budget {result.kl_budget}")
        right.legend(fontsize=8)
    right.set_xlabel("weight bytes read per decode step (MB)")
    right.set_ylabel("mean KL vs bf16 (nats/token)")
    right.set_title("presets: accuracy, bytes and decode speed vs bf16")
    fig.suptitle(f"k25 bench quant: {result.positions} teacher-forced positions of {len(result.texts)} texts")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
