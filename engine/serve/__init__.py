"""The engine as a process: ZMQ server, heartbeat and registry entry, health, drain, metrics,
tracing, adapter hot-loading and KV events. It talks to the engine core's contract only."""
