"""The engine's LoRA settings, checked before anything is allocated."""

import os

from engine.base.config import EngineConfig
from engine.base.errors import EngineConfigError
from engine.lora.slots import KERNELS


def check_lora_settings(config: EngineConfig) -> None:
    if config.max_loras < 0:
        raise EngineConfigError(f"max_loras must be 0 (adapters off) or more, got {config.max_loras}")
    if config.max_cpu_loras < config.max_loras:
        raise EngineConfigError(
            f"max_cpu_loras ({config.max_cpu_loras}) must be at least max_loras ({config.max_loras})"
        )
    if config.max_lora_rank < 1:
        raise EngineConfigError(f"max_lora_rank must be at least 1, got {config.max_lora_rank}")
    if config.lora_kernel not in KERNELS:
        raise EngineConfigError(f"lora_kernel must be one of {', '.join(KERNELS)}, got {config.lora_kernel!r}")
    if config.lora_kernel == "triton" and not config.device.startswith("cuda") and os.environ.get("TRITON_INTERPRET") != "1":
        raise EngineConfigError("lora_kernel 'triton' needs a CUDA device (or TRITON_INTERPRET=1 to interpret it on the CPU)")
