"""`k25 simulate`: K25's autoscaling policies (predictive, the default, and reactive) against
the Kubernetes HPA on QPS and KEDA-style queue-depth scaling, in simulated time, on the same
seeded trace and the same slow-starting GPU pods."""

import json
from concurrent.futures import ProcessPoolExecutor

from bench.load_trace import DAY_S, TRACES

DEFAULT_DAYS = {"diurnal": 7.0}  # the other shapes: a quarter of a day
OTHER_DAYS = 0.25
DEFAULT_WORKERS = 2  # seeds run in parallel processes; a modest default for a shared machine


def register(subparsers) -> None:
    parser = subparsers.add_parser("simulate", help="compare K25's autoscaling policies with HPA and queue-depth scaling",
                                   description=__doc__)
    parser.add_argument("--trace", choices=TRACES, default="diurnal", help="the load's shape (default: diurnal)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the trace and the pod start times")
    parser.add_argument("--seeds", type=int, default=1,
                        help="run this many seeds from --seed on; prints their total, median and worst seed")
    parser.add_argument("--days", type=float, help="length of the trace (default: a week for diurnal, "
                                                   "a quarter of a day for the others)")
    parser.add_argument("--policies", help="comma-separated, of predictive, reactive, hpa, queue-depth "
                                           "(default: all)")
    parser.add_argument("--against", metavar="REVISION",
                        help="also run the predictive policy as this git revision has it (e.g. main)")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                        help=f"processes that run seeds in parallel (default: {DEFAULT_WORKERS})")
    parser.add_argument("--json", action="store_true",
                        help='print {"seed": {"policy": {...}}}, and with several seeds "total" and "spread"')
    parser.add_argument("--plot", metavar="FILE", help="write a PNG of load and replicas over time (first seed)")
    parser.set_defaults(handler=run)


def run(args) -> int:
    from bench.autoscale_simulation import POLICIES, CapacityModel  # numpy only when the command runs
    from bench.simulation_summary import spread, total

    days = args.days if args.days is not None else DEFAULT_DAYS.get(args.trace, OTHER_DAYS)
    if not days > 0:
        raise SystemExit("k25 simulate: --days must be positive")
    if args.seeds < 1:
        raise SystemExit("k25 simulate: --seeds must be at least 1")
    if args.workers < 1:
        raise SystemExit("k25 simulate: --workers must be at least 1")
    policies = tuple(args.policies.split(",")) if args.policies else POLICIES
    if unknown := [p for p in policies if p not in POLICIES]:
        raise SystemExit(f"k25 simulate: unknown policy {', '.join(unknown)}; known: {', '.join(POLICIES)}")
    if args.against:
        policies += (f"predictive@{args.against}",)
        _load_or_refuse(args.against)
    capacity, duration_s = CapacityModel(), round(days * DAY_S)
    seeds = range(args.seed, args.seed + args.seeds)
    jobs = [(args.trace, duration_s, seed, capacity, policies, bool(args.plot) and seed == args.seed) for seed in seeds]
    workers = min(args.workers, len(jobs))
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            done = list(pool.map(one_seed, *zip(*jobs)))
    else:
        done = [one_seed(*job) for job in jobs]
    results = {str(seed): summaries for seed, (summaries, _) in zip(seeds, done)}
    if args.plot:
        from bench.autoscale_simulation_plot import plot_comparison

        counts, outcomes = done[0][1]
        plot_comparison(counts, outcomes, capacity, args.plot)
    if args.seeds > 1:
        per_seed = dict(results)
        results["total"] = total(per_seed.values())
        results["spread"] = spread(per_seed)
    if args.json:
        print(json.dumps(results))
    else:
        print(f"trace {args.trace}, {days:g} days per seed")
        for seed in seeds:
            print(f"\nseed {seed}")
            print(side_by_side(results[str(seed)]))
        if args.seeds > 1:
            print(f"\ntotal over {args.seeds} seeds")
            print(side_by_side(results["total"]))
            print(f"\nover the {args.seeds} seeds: median / worst (seed)")
            print(spread_table(results["spread"]))
    return 0


def one_seed(trace, duration_s, seed, capacity, policies, keep_outcomes):
    from bench.autoscale_simulation import compare
    from bench.simulation_summary import with_ratios

    counts, outcomes = compare(trace, duration_s, seed, capacity, policies)
    summaries = with_ratios({name: outcome.summary() for name, outcome in outcomes.items()})
    return summaries, ((counts, outcomes) if keep_outcomes else None)


def _load_or_refuse(revision: str) -> None:
    from bench.policy_at_revision import predictive_policy_at

    try:
        predictive_policy_at(revision)
    except ValueError as error:
        raise SystemExit(f"k25 simulate: --against: {error}") from error


def side_by_side(summaries: dict[str, dict]) -> str:
    names = list(summaries)
    rows = [f"{'':<26}" + "".join(f"{name:>20}" for name in names)]
    for key in summaries[names[0]]:
        rows.append(f"{key.replace('_', ' '):<26}" + "".join(f"{_cell(summaries[n][key]):>20}" for n in names))
    return "\n".join(rows)


def spread_table(spread: dict[str, dict]) -> str:
    names = list(spread)
    rows = [f"{'':<26}" + "".join(f"{name:>20}" for name in names)]
    for key in spread[names[0]]:
        cells = [f"{spread[n][key]['median']:g} / {spread[n][key]['worst']:g} ({spread[n][key]['worst_seed']})"
                 if key in spread[n] else "-" for n in names]
        rows.append(f"{key.replace('_', ' '):<26}" + "".join(f"{cell:>20}" for cell in cells))
    return "\n".join(rows)


def _cell(value) -> str:
    if value is None:
        return "-"
    return str(value) if isinstance(value, int) else f"{value:g}"
