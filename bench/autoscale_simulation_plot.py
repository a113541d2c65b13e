"""A PNG of one simulation, one panel per autoscaler: the load (in pods' worth of
requests) and the pods requested and ready, over the busy hours of the first day (a whole
week is too dense to read; the titles carry the totals of the whole run)."""

import matplotlib

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from bench.autoscale_simulation import CapacityModel, Outcome  # noqa: E402

SHOWN_S = (8 * 3600, 16 * 3600)
BIN_S = 10


def binned(values: np.ndarray, how) -> np.ndarray:
    whole = len(values) // BIN_S * BIN_S
    return how(values[:whole].reshape(-1, BIN_S), axis=1)


def plot_comparison(counts: np.ndarray, outcomes: dict[str, Outcome], capacity: CapacityModel, path: str) -> None:
    start, end = SHOWN_S if len(counts) >= SHOWN_S[1] else (0, len(counts))
    shown = slice(start, end)
    load = binned(counts[shown] / capacity.pod_qps, np.max)
    hours = (start + np.arange(len(load)) * BIN_S) / 3600
    figure, axes = plt.subplots(len(outcomes), 1, figsize=(14, 4 * len(outcomes)), sharex=True, sharey=True)
    for ax, (name, outcome) in zip(np.atleast_1d(axes), outcomes.items()):
        ready = binned(outcome.ready[shown], np.min)
        ax.fill_between(hours, ready, load, where=load > ready, color="tab:red", alpha=0.35, step="post",
                        label="over capacity")
        ax.step(hours, load, where="post", color="0.45", lw=0.6, label="load, in pods' worth")
        ax.step(hours, binned(outcome.replicas[shown], np.max), where="post", color="tab:blue", lw=1.2,
                label="pods requested")
        ax.step(hours, ready, where="post", color="tab:green", lw=1.2, label="pods ready")
        total = outcome.summary()
        ax.set_title(f"{name} (whole run): {total['seconds_over_capacity']} s and "
                     f"{total['requests_over_capacity']} requests over capacity, "
                     f"{total['gpu_hours']:.1f} GPU-hours, {total['scale_events']} scale events, "
                     f"{total['released_before_ready']} pods released before ready")
        ax.set_ylabel("pods")
        ax.legend(loc="upper left", fontsize="small")
    np.atleast_1d(axes)[-1].set_xlabel("hour of the trace")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
