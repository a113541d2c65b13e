"""The engine's CPU thread count: the CPUs the process may use (affinity, cgroup quota), an
equal share for each of several engines on one machine, and the flag that overrides both; and
how long its OpenMP threads spin before they sleep."""

import os
import subprocess
import sys

import pytest
import torch

from engine.hardware.cpu_threads import (
    OMP_SPIN_COUNT,
    omp_wait_env,
    parse_cgroup_v1_quota,
    parse_cgroup_v2_cpu_max,
    threads_per_engine,
    usable_cpus,
)
from k25.cli import build_parser
from k25.commands.engine_settings import set_cpu_threads


@pytest.mark.parametrize("affinity, quota, expected", [
    (8, None, 8),  # no quota: every CPU it may run on
    (8, 2.0, 2),  # a pod limited to 2 CPUs on an 8-core node
    (8, 1.5, 1),  # threads past the quota would be throttled, not run
    (8, 0.5, 1),  # at least one
    (2, 4.0, 2),  # a quota above the affinity set adds nothing
])
def test_the_cpus_it_may_use_are_its_affinity_capped_by_its_quota(affinity, quota, expected):
    assert usable_cpus(affinity, quota) == expected


@pytest.mark.parametrize("text, quota", [("max 100000\n", None), ("200000 100000\n", 2.0), ("150000 100000", 1.5), ("", None)])
def test_cgroup_v2_cpu_max_is_read_as_cpus(text, quota):
    assert parse_cgroup_v2_cpu_max(text) == quota


@pytest.mark.parametrize("quota_text, period_text, quota", [("-1\n", "100000\n", None), ("50000", "100000", 0.5)])
def test_cgroup_v1_quota_is_read_as_cpus(quota_text, period_text, quota):
    assert parse_cgroup_v1_quota(quota_text, period_text) == quota


@pytest.mark.parametrize("cpus, engines, expected", [(2, 1, 2), (2, 2, 1), (2, 4, 1), (16, 3, 5), (4, 0, 4)])
def test_engines_on_one_machine_share_its_cpus(cpus, engines, expected):
    assert threads_per_engine(cpus, engines) == expected


def test_a_process_pinned_to_one_cpu_computes_on_one_thread():
    pinned = ("import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
              "from engine.hardware.cpu_threads import default_cpu_threads; print(default_cpu_threads())")
    done = subprocess.run([sys.executable, "-c", pinned], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "1"


def test_the_flag_sets_torchs_threads():
    before = torch.get_num_threads()
    try:
        assert set_cpu_threads(1) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("value, message", [
    ("0", "must be at least 1 (or auto), got 0"),
    ("two", "expected a whole number of threads or auto, got 'two'"),
])
def test_the_engine_refuses_a_thread_count_that_is_neither_a_number_nor_auto(value, message, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["engine", "--cpu-threads", value])
    assert f"argument --cpu-threads: {message}" in capsys.readouterr().err


@pytest.mark.parametrize("environ, expected", [
    ({}, {"GOMP_SPINCOUNT": str(OMP_SPIN_COUNT)}),
    ({"GOMP_SPINCOUNT": "300000"}, {}),  # the user's own spin count stays
    ({"OMP_WAIT_POLICY": "ACTIVE"}, {}),  # so does a wait policy (a spin count would override it)
])
def test_the_engine_shortens_the_spin_unless_the_environment_says_how_openmp_waits(environ, expected):
    assert omp_wait_env(environ) == expected


def test_the_spin_count_set_before_torch_loads_reaches_libgomp():
    """`k25 engine` sets it in its own environment before it imports torch: libgomp reads it
    then (an invalid value shows that it was read), and the CLI has not loaded torch before."""
    script = ("import os, sys; from k25.cli import build_parser; build_parser().parse_args(['engine', '--model', 'x']); "
              "assert 'torch' not in sys.modules; os.environ['GOMP_SPINCOUNT'] = 'not-a-number'; import torch")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"})
    assert done.returncode == 0, done.stderr
    assert "libgomp: Invalid value for environment variable GOMP_SPINCOUNT" in done.stderr
