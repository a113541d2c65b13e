"""What the device decides: node profiles, how many KV chunks fit, the dtype, CPU threads."""
