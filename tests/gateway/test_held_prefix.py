"""What holding a prompt in a tier is worth to routing (services/gateway/held_prefix.py), and the
order plan_route gives engines holding it on the device, in host memory, on disk or not at all."""

import pytest

from services.gateway.held_prefix import DISK_TIER_WEIGHT, HOST_TIER_WEIGHT, HeldRun, TierWeights, held_share, saved_share
from services.gateway.routing import EngineView, plan_route

W = TierWeights(host=0.9, disk=0.6)


@pytest.mark.parametrize("run, prompt_tokens, held, saved", [
    (HeldRun(), 160, 0.0, 0.0),
    (HeldRun(device=10), 160, 1.0, 1.0),
    (HeldRun(host=10), 160, 1.0, 0.9),
    (HeldRun(disk=10), 160, 1.0, 0.6),
    (HeldRun(device=4, host=4, disk=2), 160, 1.0, (4 + 0.9 * 4 + 0.6 * 2) / 10),
    (HeldRun(device=10), 320, 0.5, 0.5),  # half the prompt held
    (HeldRun(host=10), 320, 0.5, 0.45),
    (HeldRun(device=10), 150, 1.0, 1.0),  # capped: a run never saves more than the prompt
    (HeldRun(device=3), 0, 0.0, 0.0),
])
def test_held_and_saved_shares(run, prompt_tokens, held, saved):
    assert held_share(run, 16, prompt_tokens) == pytest.approx(held)
    assert saved_share(run, 16, prompt_tokens, W) == pytest.approx(saved)


def test_the_documented_weights_rank_the_tiers():
    assert 0.0 < DISK_TIER_WEIGHT <= HOST_TIER_WEIGHT < 1.0
    assert TierWeights() == (HOST_TIER_WEIGHT, DISK_TIER_WEIGHT)


def engine(engine_id: str, running: int = 0) -> EngineView:
    return EngineView(engine_id, f"10.0.0.1:{len(engine_id)}", "p", "m", 256, 4096, 1.0, running, 0, 0.92, 1024,
                      heartbeat_ttl_s=5.0, block_size=16)


PROMPT = 1024  # 64 blocks of 16, 4 chunks of 256
WHOLE = 64


@pytest.mark.parametrize("runs, loads, expected", [
    # equal load: the device beats host memory, which beats disk, which beats holding nothing
    ({"dev": HeldRun(device=WHOLE), "host": HeldRun(host=WHOLE), "disk": HeldRun(disk=WHOLE), "none": HeldRun()},
     {}, ["dev", "host", "disk", "none"]),
    # the whole prompt in host memory is worth more than half of it on the device
    ({"half": HeldRun(device=WHOLE // 2), "host": HeldRun(host=WHOLE)}, {}, ["host", "half"]),
    # the device part of a run counts whole, the rest by its tier
    ({"mixed": HeldRun(device=32, host=32), "host": HeldRun(host=WHOLE)}, {}, ["mixed", "host"]),
    # a holder in host memory is worth more than an idle engine up to the load its saving is worth:
    # 4 chunks x 4 requests x 0.9 = 14.4 requests
    ({"host": HeldRun(host=WHOLE), "idle": HeldRun()}, {"host": 14}, ["host", "idle"]),
    ({"host": HeldRun(host=WHOLE), "idle": HeldRun()}, {"host": 15}, ["idle", "host"]),
])
def test_routing_ranks_engines_by_the_tier_that_holds_the_prompt(runs, loads, expected):
    engines = [engine(e, loads.get(e, 0)) for e in runs]
    shares = {e: saved_share(run, 16, PROMPT, W) for e, run in runs.items() if run.blocks}
    assert [e.engine_id for e in plan_route(engines, PROMPT, 10, cached_share=shares).routes[0].engines] == expected
