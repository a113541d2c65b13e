"""An AdapterRollout's spec as a typed value, with the defaults and checks of its CRD (the
API server enforces them too; checking here keeps the operator honest on any server, and
covers the one rule the CRD leaves out: the canary must be another version)."""

import re
from dataclasses import dataclass

from common.adapter_stats import ADAPTER_STATS_TTL_S
from common.rollout_keys import NAME_PATTERN, SHA256_PATTERN

POOL_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a Kubernetes object name (DNS label)
DEFAULTS = {"steps": [5, 20, 50, 100], "interval": 60, "maxErrorRate": 0.01, "maxP95LatencyMs": 10000,
            "maxP95LatencyRatio": 3.0, "minRequestsPerStep": 100, "maxRequestsPerTenant": 10, "failureThreshold": 3, "allowList": []}


class RolloutSpecError(ValueError):
    """The spec cannot be rolled out; the message says which field and why."""


@dataclass(frozen=True)
class AdapterVersion:
    version: str
    source: str  # path under the engines' adapter root
    sha256: str  # of adapter_config.json followed by adapter_model.safetensors, as the engine checks it


@dataclass(frozen=True)
class RolloutSpec:
    adapter: str
    pool: str  # the EnginePool whose engines serve the adapter
    stable: AdapterVersion
    canary: AdapterVersion
    steps: tuple[int, ...]  # canary weights in percent, increasing, the last 100
    interval_s: int  # traffic looked at by each check, and the least time between two steps
    max_error_rate: float
    max_p95_latency_s: float
    # against the stable version over the same interval (when it had min_requests_per_step): the
    # canary's error rate may exceed stable's by max_error_rate, its p95 be this many times stable's
    # (the p95s are histogram bounds 2-2.5x apart: below 2.5 one bucket of noise would fail a canary)
    max_p95_latency_ratio: float
    min_requests_per_step: int
    # a check's error rate and p95 weigh each tenant's requests as at most this many
    # (common/adapter_stats.py): one tenant cannot decide a verdict by sending more
    max_requests_per_tenant: int
    failure_threshold: int
    allow_list: tuple[str, ...] = ()


def parse_rollout_spec(spec: dict) -> RolloutSpec:
    spec = {**DEFAULTS, **spec}
    adapter = _matching(spec, "adapter", NAME_PATTERN, "1-63 letters, digits, '.', '_' or '-'")
    pool = _matching(spec, "pool", POOL_NAME, "a Kubernetes object name")
    stable, canary = _version(spec, "stable"), _version(spec, "canary")
    if canary.version == stable.version:
        raise RolloutSpecError(f"spec.canary.version must differ from spec.stable.version ({stable.version!r})")
    return RolloutSpec(
        adapter=adapter, pool=pool, stable=stable, canary=canary, steps=_steps(spec["steps"]),
        interval_s=_integer(spec, "interval", least=1, most=ADAPTER_STATS_TTL_S),
        max_error_rate=_number(spec, "maxErrorRate", least=0.0, most=1.0),
        max_p95_latency_s=_number(spec, "maxP95LatencyMs", least=1.0) / 1000,
        max_p95_latency_ratio=_number(spec, "maxP95LatencyRatio", least=1.0),
        min_requests_per_step=_integer(spec, "minRequestsPerStep", least=1),
        max_requests_per_tenant=_integer(spec, "maxRequestsPerTenant", least=1),
        failure_threshold=_integer(spec, "failureThreshold", least=1),
        allow_list=_allow_list(spec["allowList"]),
    )


def _matching(spec: dict, name: str, pattern: re.Pattern, what: str, path: str = "spec") -> str:
    value = spec.get(name)
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise RolloutSpecError(f"{path}.{name} must be {what}, got {value!r}")
    return value


def _version(spec: dict, which: str) -> AdapterVersion:
    given = spec.get(which)
    if not isinstance(given, dict):
        raise RolloutSpecError(f"spec.{which} is required: {{version, source, sha256}}")
    version = _matching(given, "version", NAME_PATTERN, "1-63 letters, digits, '.', '_' or '-'", f"spec.{which}")
    source = given.get("source")
    if not isinstance(source, str) or not source:
        raise RolloutSpecError(f"spec.{which}.source must be a non-empty path, got {source!r}")
    sha256 = given.get("sha256")
    if not isinstance(sha256, str) or not SHA256_PATTERN.fullmatch(sha256):
        raise RolloutSpecError(f"spec.{which}.sha256 must be 64 lowercase hex digits, got {sha256!r}")
    return AdapterVersion(version, source, sha256)


def _steps(steps) -> tuple[int, ...]:
    if (not isinstance(steps, list) or not steps
            or not all(isinstance(s, int) and not isinstance(s, bool) and 1 <= s <= 100 for s in steps)):
        raise RolloutSpecError(f"spec.steps must be a non-empty list of percents 1..100, got {steps!r}")
    if any(a >= b for a, b in zip(steps, steps[1:])):
        raise RolloutSpecError(f"spec.steps must be strictly increasing, got {steps}")
    if steps[-1] != 100:
        raise RolloutSpecError(f"spec.steps must end at 100 (the canary takes all traffic before it is "
                               f"promoted), got {steps}")
    return tuple(steps)


def _integer(spec: dict, name: str, least: int, most: int | None = None) -> int:
    value = spec[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise RolloutSpecError(f"spec.{name} must be an integer, got {value!r}")
    if value < least or (most is not None and value > most):
        bounds = f"from {least} to {most}" if most is not None else f"at least {least}"
        raise RolloutSpecError(f"spec.{name} must be {bounds}, got {value}")
    return value


def _number(spec: dict, name: str, least: float, most: float | None = None) -> float:
    value = spec[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RolloutSpecError(f"spec.{name} must be a number, got {value!r}")
    if value < least or (most is not None and value > most):
        bounds = f"from {least:g} to {most:g}" if most is not None else f"at least {least:g}"
        raise RolloutSpecError(f"spec.{name} must be {bounds}, got {value}")
    return float(value)


def _allow_list(users) -> tuple[str, ...]:
    if not isinstance(users, list) or not all(isinstance(u, str) and u for u in users):
        raise RolloutSpecError(f"spec.allowList must be a list of user ids, got {users!r}")
    return tuple(users)
