"""The order in which waiting sequences are admitted: fewest prompt tokens left to compute
first, except preempted and overdue ones, which keep first-come-first-served order ahead."""

import time

import pytest

from engine.base.config import EngineConfig
from engine.core.admission_order import ORDER_WINDOW, admission_order
from engine.core.block_manager import BlockManager
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from k25.cli import build_parser
from tests.engine.core.test_scheduler import run_step

DOCUMENT = list(range(100, 164))  # 64 tokens: four full blocks of 16


def test_fewest_tokens_left_first_then_arrival():
    assert admission_order([500, 20, 500, 20], [0.0] * 4, [False] * 4, overtake_limit_s=5.0) == [1, 3, 0, 2]


def test_preempted_and_overdue_sequences_go_first_in_arrival_order():
    order = admission_order([900, 10, 800, 700], [1.0, 1.0, 6.0, 1.0], [False, False, False, True], overtake_limit_s=5.0)
    assert order == [2, 3, 1, 0]


def test_limit_zero_is_first_come_first_served():
    assert admission_order([500, 20, 300], [0.0, 0.0, 0.0], [False] * 3, overtake_limit_s=0.0) == [0, 1, 2]


def question(name: str, prompt: list[int]) -> Sequence:
    return Sequence(name, prompt, SamplingParams(max_tokens=2))


def scheduler_with_cached_document(overtake_limit_s: float) -> Scheduler:
    """A scheduler whose prefix cache holds DOCUMENT, then two new 200-token documents queued
    before a second question about DOCUMENT."""
    scheduler = Scheduler(BlockManager(64, 16), max_num_batched_tokens=32, max_num_seqs=8, overtake_limit_s=overtake_limit_s)
    scheduler.add(question("first", DOCUMENT + [1, 2, 3]))
    while scheduler.num_unfinished:
        run_step(scheduler)
    scheduler.add(question("new-a", list(range(1000, 1200))))
    scheduler.add(question("new-b", list(range(2000, 2200))))
    scheduler.add(question("second", DOCUMENT + [4, 5, 6]))
    return scheduler


def test_a_question_about_a_cached_document_overtakes_new_documents():
    batch = scheduler_with_cached_document(overtake_limit_s=5.0).schedule()
    # the second question computes only its last 3 tokens; new-a takes the rest of the budget
    assert [(s.request_id, n) for s, n in batch.items] == [("second", 3), ("new-a", 29)]
    assert batch.items[0][0].num_cached_tokens == len(DOCUMENT)


def test_first_come_first_served_when_the_limit_is_zero():
    batch = scheduler_with_cached_document(overtake_limit_s=0.0).schedule()
    assert [(s.request_id, n) for s, n in batch.items] == [("new-a", 32)]


def test_a_request_waiting_past_the_limit_is_not_overtaken():
    scheduler = scheduler_with_cached_document(overtake_limit_s=5.0)
    scheduler.waiting[1].arrival_time = time.monotonic() - 6.0  # new-b has waited 6 s
    batch = scheduler.schedule()
    assert [(s.request_id, n) for s, n in batch.items] == [("new-b", 32)]


def test_only_the_window_is_reordered():
    scheduler = Scheduler(BlockManager(512, 16), max_num_batched_tokens=8, max_num_seqs=1, overtake_limit_s=5.0)
    for i in range(ORDER_WINDOW):
        scheduler.add(question(f"long{i}", list(range(40))))
    scheduler.add(question("short", [1]))  # shortest, but behind a full window
    assert [s.request_id for s in scheduler._admission_order()][-1] == "short"
    assert [s.request_id for s, _ in scheduler.schedule().items] == ["long0"]


@pytest.mark.parametrize("value, message", [
    ("-1", "must be at least 0, got -1.0"),
    ("nan", "must be a number, got nan"),
    ("inf", "must be a number, got inf"),
    ("soon", "expected a number, got 'soon'"),
])
def test_the_engine_refuses_an_overtake_limit_that_is_not_seconds(value, message, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["engine", "--overtake-limit-s", value])
    assert f"argument --overtake-limit-s: {message}" in capsys.readouterr().err


def test_the_flag_defaults_to_the_engine_configs_default():
    args = build_parser().parse_args(["engine", "--overtake-limit-s", "0"])
    assert args.overtake_limit_s == 0.0
    assert build_parser().parse_args(["engine"]).overtake_limit_s == EngineConfig().overtake_limit_s


def test_a_prompt_being_prefilled_is_not_prefilled_twice_at_once():
    scheduler = Scheduler(BlockManager(64, 16), max_num_batched_tokens=100, max_num_seqs=8, overtake_limit_s=5.0)
    scheduler.add(question("first", DOCUMENT + [1, 2, 3]))
    scheduler.add(question("second", DOCUMENT + [4, 5, 6]))
    other = question("other", list(range(500, 520)))
    scheduler.add(other)
    # the budget would have room for the second question's 67 tokens, but its document is the first's:
    # it waits, keeping its place, while an unrelated prompt goes ahead
    assert run_and_list(scheduler) == [("other", 20), ("first", 67)]
    assert [s.request_id for s in scheduler.waiting] == ["second"]
    assert ("second", 3) in run_and_list(scheduler)  # the document's four blocks found cached


def run_and_list(scheduler: Scheduler) -> list[tuple[str, int]]:
    """One fake step (as run_step, without finishing anyone): what it computed, by request id."""
    batch = scheduler.schedule()
    items = list(batch.items)
    for seq, n in items:
        scheduler.mark_computed(seq, n)
        if seq.num_computed_tokens == seq.num_tokens:
            seq.output_token_ids.append(7)
    return [(s.request_id, n) for s, n in items]
