"""What the pool's own start-ups say about the pods still starting: when each is likely ready,
how long until enough of them are, and how many more to start when being over capacity has a
price. Pure functions over the start-up times seen (creation to ready) and the ages of the
pods that are still starting; no assumption about the distribution's shape.

Pods start at spread times (one to five minutes for a GPU pod), so starting more pods than are
missing gets the missing ones ready sooner: the first of n is ready earlier than the first of
one. The extra ones serve nothing if they are released before ready: `pods_to_start` weighs
the seconds over capacity they save, at a price in pod-seconds, against the pod-seconds they
cost until the missing pods are ready.
"""

import bisect
import math


def ready_within(samples: list[float], age: float, t: float) -> float:
    """The chance that a pod `age` seconds old is ready within `t` more seconds, from the sorted
    start-ups seen; a pod older than every one seen is taken as about to be ready."""
    if not samples:
        return 1.0
    left = len(samples) - bisect.bisect_right(samples, age)
    if left == 0:
        return 1.0
    return (bisect.bisect_right(samples, age + t) - (len(samples) - left)) / left


def expected_remaining(samples: list[float], age: float) -> float:
    """The mean time until a pod `age` seconds old is ready (0 if older than every one seen)."""
    later = [s - age for s in samples if s > age]
    return sum(later) / len(later) if later else 0.0


GRID_S = 5.0  # resolution of the times compared


def _curves(samples: list[float], ages: tuple[float, ...]) -> tuple[list[float], list[float], list[float]]:
    """Times from now, the expected count of the starting pods ready by each, and the chance
    that a pod started now is."""
    times = [i * GRID_S for i in range(int(max(samples) // GRID_S) + 2)]
    starting = [sum(ready_within(samples, a, t) for a in ages) for t in times]
    fresh = [ready_within(samples, 0.0, t) for t in times]
    return times, starting, fresh


def _first_time(curves, fresh_pods: int, missing: int) -> float:
    times, starting, fresh = curves
    for t, ready_old, ready_new in zip(times, starting, fresh):
        if ready_old + fresh_pods * ready_new >= missing - 1e-9:
            return t
    return math.inf


def time_until_ready(samples: list[float], ages: tuple[float, ...], fresh: int, missing: int) -> float:
    """Seconds until, on average, `missing` pods are ready of those starting (`ages`) and `fresh`
    ones started now: the first time (to GRID_S) that the expected count ready reaches it.
    Infinite if the pods are too few."""
    if missing <= 0:
        return 0.0
    if missing > len(ages) + fresh or not samples:
        return math.inf
    return _first_time(_curves(sorted(samples), ages), fresh, missing)


def pods_to_start(samples: list[float], ages: tuple[float, ...], missing: int, over_capacity_pod_s: float,
                  most: int) -> int:
    """How many pods to start now, at most `most`: at least those that the starting ones leave
    missing, and more while (price of a second over capacity + the extra pods) x the time until
    the missing pods are ready keeps falling."""
    least = min(max(0, missing - len(ages)), most)
    if missing <= 0 or not samples:
        return least
    curves = _curves(sorted(samples), ages)
    best, best_cost = least, math.inf
    for fresh in range(least, most + 1):
        cost = (over_capacity_pod_s + fresh - least) * _first_time(curves, fresh, missing)
        if cost < best_cost - 1e-9:
            best, best_cost = fresh, cost
    return best
