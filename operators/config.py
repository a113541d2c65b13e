"""What the operator is told at start."""

from dataclasses import dataclass

# kopf keeps this finalizer on every resource we handle (the timers and delete handlers ask for it)
FINALIZER = "k25.io/operator"


@dataclass(frozen=True)
class OperatorConfig:
    release: str = "k25"  # prefix of every Redis key
    redis_url: str = "redis://127.0.0.1:6379/0"  # also handed to the engines
    interval_s: float = 5.0  # between autoscaling decisions
    qps_window_s: int = 10  # QPS is the mean over this many complete seconds
