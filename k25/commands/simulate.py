"""`k25 simulate`: K25's autoscaling policies (predictive, the default, and reactive) against
the Kubernetes HPA on QPS and KEDA-style queue-depth scaling, in simulated time, on the same
seeded trace and the same slow-starting GPU pods."""

import json

from bench.load_trace import DAY_S, TRACES

DEFAULT_DAYS = {"diurnal": 7.0}  # the other shapes: a quarter of a day
OTHER_DAYS = 0.25


def register(subparsers) -> None:
    parser = subparsers.add_parser("simulate", help="compare K25's autoscaling policies with HPA and queue-depth scaling",
                                   description=__doc__)
    parser.add_argument("--trace", choices=TRACES, default="diurnal", help="the load's shape (default: diurnal)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the trace and the pod start times")
    parser.add_argument("--seeds", type=int, default=1, help="run this many seeds from --seed on, and their total")
    parser.add_argument("--days", type=float, help="length of the trace (default: a week for diurnal, "
                                                   "a quarter of a day for the others)")
    parser.add_argument("--json", action="store_true", help='print {"seed": {"policy": {...}}} (and "total")')
    parser.add_argument("--plot", metavar="FILE", help="write a PNG of load and replicas over time (first seed)")
    parser.set_defaults(handler=run)


def run(args) -> int:
    from bench.autoscale_simulation import CapacityModel, compare  # numpy only when the command runs

    days = args.days if args.days is not None else DEFAULT_DAYS.get(args.trace, OTHER_DAYS)
    if not days > 0:
        raise SystemExit("k25 simulate: --days must be positive")
    if args.seeds < 1:
        raise SystemExit("k25 simulate: --seeds must be at least 1")
    capacity = CapacityModel()
    results = {}
    for seed in range(args.seed, args.seed + args.seeds):
        counts, outcomes = compare(args.trace, round(days * DAY_S), seed, capacity)
        results[str(seed)] = {name: outcome.summary() for name, outcome in outcomes.items()}
        if args.plot and seed == args.seed:
            from bench.autoscale_simulation_plot import plot_comparison

            plot_comparison(counts, outcomes, capacity, args.plot)
    if args.seeds > 1:
        results["total"] = total(results.values())
    if args.json:
        print(json.dumps(results))
    else:
        print(f"trace {args.trace}, {days:g} days per seed")
        for seed, summaries in results.items():
            print(f"\nseed {seed}" if seed != "total" else f"\ntotal over {args.seeds} seeds")
            print(side_by_side(summaries))
    return 0


def total(runs) -> dict[str, dict]:
    """Each policy's figures summed over the runs, with its ratios to the HPA's."""
    runs = list(runs)
    summed = {policy: {key: round(sum(run[policy][key] for run in runs), 2) for key in runs[0][policy]}
              for policy in runs[0]}
    hpa = summed["hpa"]
    for figures in summed.values():
        figures["seconds_vs_hpa"] = (round(figures["seconds_over_capacity"] / hpa["seconds_over_capacity"], 3)
                                     if hpa["seconds_over_capacity"] else None)
        figures["gpu_hours_vs_hpa"] = round(figures["gpu_hours"] / hpa["gpu_hours"], 3)
    return summed


def side_by_side(summaries: dict[str, dict]) -> str:
    names = list(summaries)
    rows = [f"{'':<26}" + "".join(f"{name:>13}" for name in names)]
    for key in summaries[names[0]]:
        rows.append(f"{key.replace('_', ' '):<26}" + "".join(f"{summaries[n][key]:>13}" for n in names))
    return "\n".join(rows)
