"""KV tiers below the device: a bounded pool in host memory and a bounded directory on local
disk (docs/internals/kv-tiers.md). The policy is engine/core/tier_policy.py."""
