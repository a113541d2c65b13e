"""When `k25 up` starts an exited part again: a delay that doubles while it keeps failing,
capped, and back to the first after a healthy run."""

import pytest

from k25.restart_policy import FIRST_DELAY_S, HEALTHY_RUN_S, MAX_DELAY_S, describe_exit, failures_in_a_row, restart_delay_s


def test_the_delay_doubles_while_a_part_keeps_failing_up_to_the_cap():
    delays = [restart_delay_s(n) for n in range(1, 9)]
    assert delays[0] == FIRST_DELAY_S
    assert all(later == min(MAX_DELAY_S, 2 * earlier) for earlier, later in zip(delays, delays[1:]))
    assert delays[-1] == MAX_DELAY_S
    assert restart_delay_s(10_000) == MAX_DELAY_S


def test_quick_exits_count_up_and_a_healthy_run_starts_over():
    assert failures_in_a_row(0, ran_for_s=0.5) == 1
    assert failures_in_a_row(3, ran_for_s=HEALTHY_RUN_S / 2) == 4
    assert failures_in_a_row(7, ran_for_s=HEALTHY_RUN_S) == 1


def test_a_delay_needs_an_exit():
    with pytest.raises(ValueError, match="at least one exit"):
        restart_delay_s(0)


@pytest.mark.parametrize("returncode, text", [
    (0, "code 0"), (3, "code 3"), (-9, "signal SIGKILL"), (-15, "signal SIGTERM"), (-200, "signal 200"),
])
def test_exits_are_described_by_code_or_signal(returncode, text):
    assert describe_exit(returncode) == text
