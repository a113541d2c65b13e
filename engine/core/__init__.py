"""The engine core: requests in, a schedule per step, outputs out. Pure Python, no torch: the
model runner (engine/runner/) executes what the core schedules."""
