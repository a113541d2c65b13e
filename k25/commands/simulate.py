"""`k25 simulate`: K25's autoscaling policy against the Kubernetes HPA algorithm, in
simulated time, on the same bursty diurnal trace and the same slow-starting GPU pods."""

import json

from bench.load_trace import DAY_S, TraceShape


def register(subparsers) -> None:
    parser = subparsers.add_parser("simulate", help="compare K25's autoscaling policy with Kubernetes' HPA",
                                   description=__doc__)
    parser.add_argument("--seed", type=int, default=0, help="seed of the trace and the pod start times")
    parser.add_argument("--days", type=float, default=7.0, help="length of the trace (default: a week)")
    parser.add_argument("--json", action="store_true", help='print {"k25": {...}, "hpa": {...}}')
    parser.add_argument("--plot", metavar="FILE", help="write a PNG of load and replicas over time")
    parser.set_defaults(handler=run)


def run(args) -> int:
    from bench.autoscale_simulation import CapacityModel, compare  # numpy only when the command runs

    if not args.days > 0:
        raise SystemExit("k25 simulate: --days must be positive")
    capacity = CapacityModel()
    counts, outcomes = compare(args.seed, TraceShape(duration_s=round(args.days * DAY_S)), capacity)
    summaries = {name: outcome.summary() for name, outcome in outcomes.items()}
    if args.json:
        print(json.dumps(summaries))
    else:
        print(side_by_side(summaries))
    if args.plot:
        from bench.autoscale_simulation_plot import plot_comparison

        plot_comparison(counts, outcomes, capacity, args.plot)
    return 0


def side_by_side(summaries: dict[str, dict]) -> str:
    names = list(summaries)
    rows = [f"{'':<26}" + "".join(f"{name:>12}" for name in names)]
    for key in summaries[names[0]]:
        rows.append(f"{key.replace('_', ' '):<26}" + "".join(f"{summaries[n][key]:>12}" for n in names))
    return "\n".join(rows)
