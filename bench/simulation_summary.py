"""Figures over several seeds of `k25 simulate`: each policy's totals with their ratios to the
HPA's, and the spread over seeds (median and worst seed), so that a total carried by one lucky
seed shows."""

import statistics

BASELINE = "hpa"
# per seed, for the spread: the figure and whether a higher one is worse
SPREAD = {"seconds_vs_hpa": True, "gpu_hours_vs_hpa": True, "seconds_over_capacity": True,
          "released_before_ready": True, "released_gpu_hours": True, "scale_events_vs_hpa": True}


def with_ratios(summaries: dict[str, dict]) -> dict[str, dict]:
    """Each policy's figures plus its ratios to the HPA's (None without an HPA run, or where the
    HPA's figure is zero)."""
    hpa = summaries.get(BASELINE)
    out = {}
    for policy, figures in summaries.items():
        figures = dict(figures)
        for key, ratio in (("seconds_over_capacity", "seconds_vs_hpa"), ("gpu_hours", "gpu_hours_vs_hpa"),
                           ("scale_events", "scale_events_vs_hpa")):
            figures[ratio] = round(figures[key] / hpa[key], 3) if hpa and hpa[key] else None
        out[policy] = figures
    return out


def total(runs) -> dict[str, dict]:
    """Each policy's figures summed over the runs, with its ratios to the HPA's."""
    runs = list(runs)
    summed = {policy: {key: round(sum(run[policy][key] for run in runs), 2) for key in runs[0][policy]
                       if not key.endswith("_vs_hpa")}
              for policy in runs[0]}
    return with_ratios(summed)


def spread(per_seed: dict[str, dict]) -> dict[str, dict]:
    """For each policy and figure: the median over seeds and the worst seed (its figure and which)."""
    policies = next(iter(per_seed.values()))
    out = {}
    for policy in policies:
        out[policy] = {}
        for key, higher_is_worse in SPREAD.items():
            values = {seed: run[policy][key] for seed, run in per_seed.items() if run[policy].get(key) is not None}
            if not values:
                continue
            worst = (max if higher_is_worse else min)(values, key=values.get)
            out[policy][key] = {"median": round(statistics.median(values.values()), 3), "worst": values[worst],
                                "worst_seed": int(worst)}
    return out


DEFAULT_DAYS = {"diurnal": 7.0}  # the simulated length of a trace; the other shapes: a quarter of a day
OTHER_DAYS = 0.25


def one_seed(trace, duration_s, seed, capacity, policies, keep_outcomes):
    """One seed's summaries with their ratios to the HPA (and its counts and outcomes, for plots),
    in a worker process of `k25 simulate` or the held-out runs."""
    from bench.autoscale_simulation import compare

    counts, outcomes = compare(trace, duration_s, seed, capacity, policies)
    summaries = with_ratios({name: outcome.summary() for name, outcome in outcomes.items()})
    return summaries, ((counts, outcomes) if keep_outcomes else None)
