"""What the gateway's own counters say a run's prompts found cached, by KV tier: its `/metrics`
read before and after the run (`k25_gateway_prompt_tokens`, `k25_gateway_cached_prompt_tokens`),
so that the figures count every engine behind it and need no access to the engines."""

import httpx
from prometheus_client.parser import text_string_to_metric_families

TIERS = ("device", "host", "disk")


def prompt_token_counters(metrics_text: str) -> dict[str, float]:
    """{"prompt": all prompt tokens, "device"/"host"/"disk": those found cached there}, summed over pools."""
    totals = dict.fromkeys(("prompt", *TIERS), 0.0)
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "k25_gateway_prompt_tokens_total":
                totals["prompt"] += sample.value
            elif sample.name == "k25_gateway_cached_prompt_tokens_total" and sample.labels.get("tier") in TIERS:
                totals[sample.labels["tier"]] += sample.value
    return totals


def tier_shares(before: dict[str, float], after: dict[str, float]) -> dict[str, float] | None:
    """Each tier's share of the prompt tokens sent between the two readings; None if none were."""
    prompt = after["prompt"] - before["prompt"]
    if prompt <= 0:
        return None
    return {tier: (after[tier] - before[tier]) / prompt for tier in TIERS}


async def read_counters(client: httpx.AsyncClient, url: str) -> dict[str, float] | None:
    """The gateway's counters now, or None where it serves no such metrics (another server)."""
    try:
        response = await client.get(f"{url}/metrics")
    except httpx.HTTPError:
        return None
    if response.status_code != 200 or "k25_gateway_prompt_tokens_total" not in response.text:
        return None
    return prompt_token_counters(response.text)
