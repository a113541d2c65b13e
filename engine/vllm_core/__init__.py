"""vLLM as a second engine backend: its engine, in this process, behind K25's engine-core
contract (engine/core/contract.py), so the ZMQ server, heartbeat, health, metrics and tracing
(engine/serve/) serve it unchanged. Only core.py, headless.py and EnginePlan.vllm_engine_args
import vLLM; the rest is plain Python the tests and the operator read without it."""
