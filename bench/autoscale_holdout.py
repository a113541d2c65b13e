"""The predictive policy against the HPA on seeds it was not tuned on (the policy's parameters
were chosen on seeds 0-9): for each trace, every run of three consecutive seeds in the given
ranges, totalled, with the worst single seed beside it, and the policy as a git revision had it
(`--against`) on the same seeds.

    .venv/bin/python -m bench.autoscale_holdout --against main --seeds 10-22,100-102 > holdout.json
"""

import argparse
import json
from concurrent.futures import ProcessPoolExecutor

from bench.load_trace import TRACES
from bench.simulation_summary import total, with_ratios
from k25.commands.simulate import DEFAULT_DAYS, OTHER_DAYS, one_seed

WINDOW = 3


def seed_ranges(text: str) -> list[list[int]]:
    """"10-22,100-102" -> [[10, ..., 22], [100, 101, 102]]."""
    ranges = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        ranges.append(list(range(int(first), int(last or first) + 1)))
    return ranges


def windows(per_seed: dict[int, dict], ranges: list[list[int]], policy: str) -> list[dict]:
    """Each run of WINDOW consecutive seeds: the policy's totals against the HPA's and its worst seed."""
    out = []
    for seeds in ranges:
        for start in range(len(seeds) - WINDOW + 1):
            runs = [per_seed[s] for s in seeds[start:start + WINDOW]]
            summed = total(runs)[policy]
            worst = max(seeds[start:start + WINDOW], key=lambda s: per_seed[s][policy]["seconds_vs_hpa"] or 0)
            out.append({"seeds": f"{seeds[start]}-{seeds[start + WINDOW - 1]}", **summed,
                        "worst_seed": worst, "worst_seconds_vs_hpa": per_seed[worst][policy]["seconds_vs_hpa"],
                        "worst_gpu_hours_vs_hpa": max(per_seed[s][policy]["gpu_hours_vs_hpa"]
                                                      for s in seeds[start:start + WINDOW])})
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default=",".join(TRACES))
    parser.add_argument("--seeds", default="10-22,100-102", help="ranges of seeds, e.g. 10-22,100-102")
    parser.add_argument("--against", default="main", help="git revision of the policy to compare with")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--days", type=float, help="length of each trace (default: as k25 simulate's)")
    args = parser.parse_args(argv)
    from bench.autoscale_simulation import CapacityModel

    ranges = seed_ranges(args.seeds)
    policies = ("predictive", "hpa", f"predictive@{args.against}")
    jobs = [(trace, round((args.days or DEFAULT_DAYS.get(trace, OTHER_DAYS)) * 86_400), seed, CapacityModel(), policies,
             False)
            for trace in args.traces.split(",") for seeds in ranges for seed in seeds]
    with ProcessPoolExecutor(args.workers) as pool:
        done = list(pool.map(one_seed, *zip(*jobs)))
    report = {}
    for trace in args.traces.split(","):
        per_seed = {job[2]: with_ratios(summaries) for job, (summaries, _) in zip(jobs, done) if job[0] == trace}
        report[trace] = {"per_seed": per_seed,
                         "windows": {p: windows(per_seed, ranges, p) for p in (policies[0], policies[2])}}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
