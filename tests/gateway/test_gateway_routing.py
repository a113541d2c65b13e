"""The routing decision as a pure function: pool by length, engine by free KV."""

from dataclasses import replace

import pytest

from common.redis_keys import ENTRY_LIMITS
from services.gateway.routing import (
    EngineView,
    PoolInfo,
    Refusal,
    attempts,
    known_pools,
    largest_context,
    plan_route,
    pools_without_engines,
    preferred_pool,
)


def engine(engine_id, pool="short", chunk_size=256, max_model_len=2048, free=1.0, running=0, waiting=0,
           kv_admission_limit=0.92, max_waiting=1024):
    return EngineView(engine_id, f"10.0.0.1:{len(engine_id)}", pool, "m", chunk_size, max_model_len, free, running, waiting,
                      kv_admission_limit, max_waiting, heartbeat_ttl_s=5.0)


SHORT = [engine("s1", free=0.5), engine("s2", free=0.9)]
LONG = [engine("l1", pool="long", chunk_size=2048, max_model_len=32768, free=0.7)]


def test_nothing_registered_is_no_engines():
    assert plan_route([], 10, 10).refusal is Refusal.NO_ENGINES


def test_short_prompt_goes_to_the_smallest_chunk_that_holds_it():
    plan = plan_route(SHORT + LONG, prompt_tokens=100, max_tokens=50)
    assert [r.pool for r in plan.routes] == ["short", "long"]
    assert plan.routes[0].chunk_size == 256 and plan.pool == "short"


def test_engines_are_ordered_by_free_kv():
    plan = plan_route(SHORT, 100, 50)
    assert [e.engine_id for e in plan.routes[0].engines] == ["s2", "s1"]


def test_equal_free_kv_prefers_the_less_busy_engine():
    plan = plan_route([engine("a", running=5), engine("b", running=1)], 10, 10)
    assert [e.engine_id for e in plan.routes[0].engines] == ["b", "a"]


def test_within_a_5_percent_step_of_free_kv_load_decides():
    plan = plan_route([engine("a", free=0.90, running=6), engine("b", free=0.88, running=1)], 10, 10)
    assert [e.engine_id for e in plan.routes[0].engines] == ["b", "a"]


def test_this_gateway_s_open_requests_count_as_load():
    """Fresher than a heartbeat: requests just sent are not in the last one yet."""
    plan = plan_route([engine("a"), engine("b")], 10, 10, open_requests={"a": 3})
    assert [e.engine_id for e in plan.routes[0].engines] == ["b", "a"]


def test_idle_engines_take_turns():
    engines = [engine("a"), engine("b"), engine("c")]
    firsts = [plan_route(engines, 10, 10, turn=t).routes[0].engines[0].engine_id for t in range(6)]
    assert firsts == ["a", "b", "c", "a", "b", "c"]


def test_long_prompt_goes_to_the_pool_whose_context_holds_it():
    plan = plan_route(SHORT + LONG, prompt_tokens=5000, max_tokens=100)
    assert [r.pool for r in plan.routes] == ["long"]


def test_prompt_over_every_chunk_prefers_the_largest_chunk():
    big_short = [engine("s", chunk_size=256, max_model_len=32768)]
    plan = plan_route(big_short + LONG, prompt_tokens=3000, max_tokens=10)
    assert [r.pool for r in plan.routes] == ["long", "short"]


def test_never_fits_reports_the_largest_context():
    plan = plan_route(SHORT + LONG, prompt_tokens=32000, max_tokens=1000)
    assert plan.refusal is Refusal.NEVER_FITS and plan.max_context == 32768


@pytest.mark.parametrize("full", [engine("f", free=0.05), engine("q", free=0.99, waiting=1024)])
def test_engines_reported_full_come_last_not_never(full):
    """A heartbeat is up to a second old: the engine may have room again, and its own
    admission check decides."""
    plan = plan_route([full, engine("ok", free=0.2)], 10, 10)
    assert [e.engine_id for e in plan.routes[0].engines] == ["ok", full.engine_id]


@pytest.mark.parametrize("limited", [engine("kv", free=0.25, kv_admission_limit=0.7), engine("queue", waiting=8, max_waiting=8)])
def test_an_engine_is_judged_full_by_its_own_limits(limited):
    """The limits come from the engine's heartbeat: the same load is full for an engine with
    lower limits and not for one with the defaults."""
    plan = plan_route([limited, engine("ok", free=0.2)], 10, 10)
    assert [e.engine_id for e in plan.routes[0].engines] == ["ok", limited.engine_id]
    roomy = engine("roomy", free=limited.free_kv_fraction, waiting=limited.waiting)
    plan = plan_route([roomy, engine("ok", free=0.2)], 10, 10)
    assert [e.engine_id for e in plan.routes[0].engines] == ["roomy", "ok"]


def test_engines_reported_full_are_tried_after_every_other_pool():
    plan = plan_route([engine("s", free=0.0), engine("s2", free=0.06)] + LONG, 100, 10)
    assert [r.pool for r in plan.routes] == ["short", "long"] and plan.pool == "short" and plan.refusal is None
    assert [e.engine_id for _, e in attempts(plan)] == ["l1", "s2", "s"]
    assert [r.chunk_size for r, _ in attempts(plan)] == [2048, 256, 256]


def test_an_engine_with_another_chunk_size_in_the_pool_is_not_used():
    plan = plan_route([engine("a"), engine("b"), engine("odd", chunk_size=512)], 10, 10)
    assert {e.engine_id for e in plan.routes[0].engines} == {"a", "b"}


GOOD_ENTRY = {"address": "h:1", "pool": "p", "model": "m", "chunk_size": 16, "max_model_len": 10, "free_kv_fraction": 1,
              "kv_admission_limit": 0.92, "max_waiting": 1024, "heartbeat_ttl_s": 5.0}


def test_a_complete_entry_is_read():
    assert EngineView.from_entry("e", GOOD_ENTRY) == EngineView("e", "h:1", "p", "m", 16, 10, 1.0, 0, 0, 0.92, 1024, 5.0)


@pytest.mark.parametrize("change", [
    {"chunk_size": "x"},
    {"chunk_size": 0},
    {"free_kv_fraction": None},
    {"kv_admission_limit": 1.5},
    {"kv_admission_limit": float("nan")},
    {"max_waiting": -1},
    {"heartbeat_ttl_s": 0},
    {"capacity_tokens": -1},
    {"capacity_tokens": "lots"},
])
def test_broken_registry_entries_are_ignored(change):
    assert EngineView.from_entry("e", {**GOOD_ENTRY, **change}) is None


@pytest.mark.parametrize("change, reason", [
    ({"chunk_size": 2**31}, "chunk_size 2147483648 is outside"),  # every gateway would pad a long prompt to 2**31
    ({"max_model_len": 2**31}, "max_model_len"),
    ({"heartbeat_ttl_s": 1e9}, "heartbeat_ttl_s"),  # kept for decades after a Redis outage
    ({"free_kv_fraction": 7}, "free_kv_fraction 7.0 is outside [0, 1]"),  # would draw all traffic
    ({"free_kv_fraction": float("inf")}, "free_kv_fraction"),
    ({"max_waiting": 2**40}, "max_waiting"),
    ({"running": -1}, "running"),
    ({"capacity_tokens": 2**50}, "capacity_tokens"),
    ({"prefix_caching": True, "block_size": 2**31}, "block_size"),
    ({"adapters": [f"a@v{i}" for i in range(5000)]}, "5000 adapters"),
    ({"address": "h" * 1000 + ":1"}, "longer than 256"),
])
def test_entries_claiming_values_beyond_their_bounds_are_ignored_with_the_reason(change, reason):
    assert EngineView.from_entry("e", {**GOOD_ENTRY, **change}) is None
    assert reason in EngineView.judge("e", {**GOOD_ENTRY, **change})


def test_entries_at_their_bounds_are_read():
    at_bounds = {"chunk_size": ENTRY_LIMITS["chunk_size"], "max_model_len": ENTRY_LIMITS["max_model_len"],
                 "heartbeat_ttl_s": ENTRY_LIMITS["heartbeat_ttl_s"], "max_waiting": ENTRY_LIMITS["max_waiting"],
                 "free_kv_fraction": 0.0, "adapters": [f"a@v{i}" for i in range(ENTRY_LIMITS["adapters"])]}
    assert isinstance(EngineView.judge("e", {**GOOD_ENTRY, **at_bounds}), EngineView)


@pytest.mark.parametrize("field", ["address", "chunk_size", "kv_admission_limit", "max_waiting", "heartbeat_ttl_s"])
def test_an_entry_without_a_field_is_ignored(field):
    """An engine that does not report its limits (one older than them) cannot be judged by
    them: it is left out rather than judged by limits the gateway would have to guess."""
    assert EngineView.from_entry("e", {k: v for k, v in GOOD_ENTRY.items() if k != field}) is None


def test_registry_entry_as_the_engine_writes_it():
    from engine.serve.registry import EngineProfile, EngineStats, registry_entry

    profile = EngineProfile("e1", "10.1.2.3:5555", "long", "a100-80g", "m", 2048, 4, 8192, 8192,
                            kv_admission_limit=0.8, max_waiting=64, heartbeat_ttl_s=3.0, block_size=32, incarnation="i7")
    view = EngineView.from_entry("e1", registry_entry(profile, EngineStats(running=2, waiting=1, kv_usage=0.25)))
    assert view == EngineView("e1", "10.1.2.3:5555", "long", "m", 2048, 8192, 0.75, 2, 1, 0.8, 64, 3.0,
                              block_size=32, incarnation="i7", capacity_tokens=8192)
    uncached = registry_entry(EngineProfile(**{**profile.__dict__, "prefix_caching": False}), EngineStats())
    assert EngineView.from_entry("e1", uncached).block_size == 0  # no prefix cache: nothing to route by


def order(plan) -> list[str]:
    return [e.engine_id for e in plan.routes[0].engines]


def test_the_engine_holding_the_prompt_wins_while_its_extra_load_is_worth_it():
    engines = [engine("cold", free=0.9, running=0), engine("warm", free=0.5, running=2)]
    assert order(plan_route(engines, 200, 10, cached_share={"warm": 0.95})) == ["warm", "cold"]
    # a one-chunk prompt: four more requests than the idle one, and its KV is no longer worth the wait
    busy = [engine("cold", running=0), engine("warm", running=4)]
    assert order(plan_route(busy, 200, 10, cached_share={"warm": 0.95})) == ["cold", "warm"]


def test_a_longer_cached_prompt_is_worth_more_load_in_proportion_to_its_chunks():
    # 1,024 tokens in 256-token chunks: 4 chunks held, worth 4 x 4 = 16 requests of load
    holder_ahead_by = lambda n: [engine("cold", running=0), engine("warm", running=n)]  # noqa: E731
    assert order(plan_route(holder_ahead_by(15), 1024, 10, cached_share={"warm": 1.0})) == ["warm", "cold"]
    assert order(plan_route(holder_ahead_by(17), 1024, 10, cached_share={"warm": 1.0})) == ["cold", "warm"]
    # half of it held: half the worth
    assert order(plan_route(holder_ahead_by(7), 1024, 10, cached_share={"warm": 0.5})) == ["warm", "cold"]
    assert order(plan_route(holder_ahead_by(9), 1024, 10, cached_share={"warm": 0.5})) == ["cold", "warm"]
    # a larger share beats a smaller one at equal load
    both = [engine("a"), engine("b")]
    assert order(plan_route(both, 1000, 10, cached_share={"a": 0.2, "b": 0.9})) == ["b", "a"]


def test_prefill_still_queued_on_an_engine_counts_as_load_by_its_chunks():
    # a new document goes where the least prefill waits, not where the fewest requests are:
    # two 1,024-token documents (8 chunks, worth 16 requests) against five short questions
    engines = [engine("docs", running=2), engine("questions", running=5)]
    assert order(plan_route(engines, 1000, 10)) == ["docs", "questions"]
    assert order(plan_route(engines, 1000, 10, unprefilled_tokens={"docs": 2048})) == ["questions", "docs"]
    # queued prefill weighs on a request as much as it has prefill of its own there: engines
    # admit fewest tokens left first, so a fully cached question goes ahead of queued documents
    held = [engine("holder"), engine("idle")]
    assert order(plan_route(held, 1024, 10, cached_share={"holder": 1.0}, unprefilled_tokens={"holder": 20_000})) == ["holder", "idle"]
    # half of it held: holding 2 chunks is worth 8 requests; 8 queued chunks (2,048 tokens)
    # weigh 16 at full, 8 for the half it must compute there
    assert order(plan_route(held, 1024, 10, cached_share={"holder": 0.5}, unprefilled_tokens={"holder": 2100})) == ["idle", "holder"]
    assert order(plan_route(held, 1024, 10, cached_share={"holder": 0.5}, unprefilled_tokens={"holder": 1900})) == ["holder", "idle"]
    # requests still count in full: a holder with more requests than its cache is worth loses
    busy = [engine("holder", running=17), engine("idle")]
    assert order(plan_route(busy, 1024, 10, cached_share={"holder": 1.0}, unprefilled_tokens={"holder": 20_000})) == ["idle", "holder"]


def test_prompts_sent_since_the_last_heartbeat_count_against_free_kv():
    # the heartbeat still shows a finished request's KV on "a": without counting what was sent to
    # "b" since, every document of a burst would go to "b"
    a = replace(engine("a", free=0.97, running=1), capacity_tokens=70_000)
    b = replace(engine("b", free=1.0), capacity_tokens=70_000)
    assert order(plan_route([a, b], 2000, 16)) == ["b", "a"]
    assert order(plan_route([a, b], 2000, 16, unprefilled_tokens={"b": 2000})) == ["a", "b"]  # 0.971: the same 5% step
    # an engine that does not report its capacity is taken at its heartbeat's word
    assert order(plan_route([a, replace(b, capacity_tokens=0)], 2000, 16, unprefilled_tokens={"b": 60_000})) == ["b", "a"]


def test_nothing_cached_routes_by_free_kv_and_load_as_before():
    engines = [engine("a", free=0.5), engine("b", free=0.9, running=3)]
    assert order(plan_route(engines, 100, 10, cached_share={})) == order(plan_route(engines, 100, 10)) == ["b", "a"]


def test_an_engine_reported_full_comes_last_even_when_it_holds_the_prompt():
    engines = [engine("full", free=0.05), engine("other", running=3)]
    plan = plan_route(engines, 1000, 10, cached_share={"full": 1.0})
    assert [e.engine_id for _, e in attempts(plan)] == ["other", "full"]


# --- health: unhealthy and draining engines, recent errors ------------------------------------

def test_engines_unhealthy_or_draining_are_never_chosen():
    engines = [engine("sick"), engine("leaving"), engine("busy", running=9, free=0.1)]
    engines[0] = replace(engines[0], healthy=False)
    engines[1] = replace(engines[1], draining=True)
    plan = plan_route(engines, 10, 10)
    assert [e.engine_id for _, e in attempts(plan)] == ["busy"]
    assert plan_route(engines[:2], 10, 10).refusal is Refusal.NO_ENGINES


def test_an_engine_that_failed_lately_comes_after_busier_and_fuller_ones_but_is_still_tried():
    """It fails fast, so it looks idle: without its errors it would be first every time."""
    engines = [engine("failing"), engine("busy", running=7, free=0.4), engine("full", free=0.01)]
    plan = plan_route(engines, 10, 10, recent_errors={"failing": 1})
    assert [e.engine_id for _, e in attempts(plan)] == ["busy", "full", "failing"]


def test_the_engine_s_own_failed_steps_count_as_errors():
    failing = replace(engine("failing"), step_failures=2)
    assert order(plan_route([failing, engine("busy", running=5)], 10, 10)) == ["busy", "failing"]


def test_among_engines_with_errors_the_one_with_fewest_goes_first():
    engines = [engine("a"), engine("b", running=4), engine("c")]
    plan = plan_route(engines, 10, 10, recent_errors={"a": 5, "b": 1, "c": 5}, turn=1)
    assert order(plan)[0] == "b"


def test_errors_outweigh_a_cached_prefix():
    engines = [engine("warm"), engine("cold", running=2)]
    plan = plan_route(engines, 1000, 10, cached_share={"warm": 1.0}, recent_errors={"warm": 1})
    assert order(plan) == ["cold", "warm"]


def test_a_pool_s_healthy_engines_go_before_another_pool_s_failing_ones():
    plan = plan_route([engine("s", pool="short")] + LONG, 100, 10, recent_errors={"s": 1})
    assert [e.engine_id for _, e in attempts(plan)] == ["l1", "s"]


def test_health_fields_are_read_and_default_to_healthy_for_older_engines():
    assert EngineView.from_entry("e", GOOD_ENTRY).routable
    view = EngineView.from_entry("e", {**GOOD_ENTRY, "healthy": False, "draining": True, "step_failures": 3,
                                       "last_step_at": 1700000000.5})
    assert (view.healthy, view.draining, view.step_failures, view.routable) == (False, True, 3, False)
    assert EngineView.from_entry("e", {**GOOD_ENTRY, "healthy": None, "step_failures": None}).routable


@pytest.mark.parametrize("change", [{"healthy": "false"}, {"draining": 1}, {"step_failures": -1}, {"step_failures": "x"}])
def test_unreadable_health_fields_leave_the_entry_out(change):
    assert EngineView.from_entry("e", {**GOOD_ENTRY, **change}) is None


# --- pools the gateway knows of, with or without engines --------------------------------------

def test_known_pools_take_the_chunk_size_and_largest_context_of_their_engines():
    engines = SHORT + LONG + [engine("s3", max_model_len=4096)]
    assert sorted(known_pools(engines), key=lambda p: p.name) == [
        PoolInfo("long", 2048, 32768), PoolInfo("short", 256, 4096)]


def test_demand_goes_to_the_pool_the_request_prefers_even_without_engines():
    pools = [PoolInfo("short", 256), PoolInfo("long", 2048, 32768)]  # short: from the settings, never seen
    assert preferred_pool(pools, 100, 50).name == "short"
    assert preferred_pool(pools, 3000, 50).name == "long"
    assert preferred_pool([PoolInfo("short", 256, 2048), PoolInfo("long", 2048, 32768)], 3000, 50).name == "long"
    assert preferred_pool([PoolInfo("long", 2048, 32768)], 32000, 1000) is None  # fits nowhere
    assert preferred_pool([], 10, 10) is None


def test_pools_an_engine_may_come_for():
    pools = [PoolInfo("short", 256, 2048), PoolInfo("long", 2048)]
    # only long may hold a 5000-token request, and it has no engine: one may come
    assert pools_without_engines(pools, SHORT, 5000, 100) == [PoolInfo("long", 2048)]
    assert pools_without_engines(pools, SHORT + LONG, 5000, 100) == []
    sick = replace(LONG[0], healthy=False)
    assert pools_without_engines(pools, SHORT + [sick], 100, 10) == [PoolInfo("long", 2048)]
    assert pools_without_engines([PoolInfo("short", 256, 2048)], [], 3000, 10) == []  # too long for it anyway


def test_largest_context_is_unknown_until_an_engine_was_seen():
    assert largest_context([PoolInfo("a", 256)]) is None
    assert largest_context([PoolInfo("a", 256), PoolInfo("b", 2048, 32768)]) == 32768
