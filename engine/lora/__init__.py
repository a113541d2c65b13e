"""LoRA adapters: PEFT files read from a root folder, cached on the CPU, served from device slots."""
