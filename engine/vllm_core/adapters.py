"""LoRA adapters served by vLLM under K25's names: `name@version` read and checked as K25's
engine does (under the adapter root, the sha256 before loading), then handed to vLLM, which
keeps up to max_loras on the device and max_cpu_loras in memory. An unloaded version takes no
new request; vLLM forgets it once no running request uses it."""

import itertools
from dataclasses import dataclass

from engine.base.errors import EngineError, ErrorCode
from engine.lora.adapter import AdapterRef, LoadedAdapter
from engine.lora.source import read_checked_files


@dataclass(frozen=True)
class ReadVLLMAdapter:
    ref: AdapterRef
    path: str  # as the caller gave it
    folder: str  # resolved under the adapter root
    sha256: str
    rank: int


class VLLMAdapters:
    def __init__(self, llm, max_loras: int, root: str | None):
        self._llm = llm
        self._max_loras = max_loras
        self._root = root
        self._loaded: dict[str, LoadedAdapter] = {}
        self._requests: dict[str, object] = {}  # name@version -> its vLLM LoRARequest, unloaded ones until unused
        self._ids = itertools.count(1)  # vLLM's adapter ids start at 1

    @property
    def keys(self) -> list[str]:
        return sorted(self._loaded)

    def read(self, ref: AdapterRef, path: str, checksum: str | None) -> ReadVLLMAdapter:
        import json

        ref.validate()
        if not self._max_loras:
            raise EngineError(ErrorCode.INVALID_ARGUMENT, "LoRA adapters are off on this engine (max_loras=0)")
        files = read_checked_files(self._root, ref.key, path, checksum)
        rank = int(json.loads(files.config).get("r", 0))
        return ReadVLLMAdapter(ref, path, str(files.directory), files.sha256, rank)

    def install(self, read: ReadVLLMAdapter) -> LoadedAdapter:
        from vllm.lora.request import LoRARequest

        existing = self._loaded.get(read.ref.key)
        if existing is not None:
            if existing.path == read.path and existing.sha256 == read.sha256:
                return existing
            raise EngineError(ErrorCode.INVALID_ARGUMENT,
                              f"adapter {read.ref.key} is already loaded from {existing.path!r}; unload it first")
        request = LoRARequest(read.ref.key, next(self._ids), read.folder)
        try:
            self._llm.add_lora(request)
        except (ValueError, RuntimeError, OSError) as exc:  # vLLM refuses what it cannot serve (rank, modules)
            raise EngineError(ErrorCode.INVALID_ARGUMENT, f"adapter {read.ref.key}: {exc}") from None
        adapter = LoadedAdapter(read.ref, read.path, read.sha256, read.rank, ())
        self._loaded[read.ref.key] = adapter
        self._requests[read.ref.key] = request
        return adapter

    def request_for(self, ref: AdapterRef):
        if ref.key not in self._loaded:
            raise EngineError(ErrorCode.ADAPTER_NOT_FOUND,
                              f"adapter {ref.name!r} version {ref.version!r} is not loaded on this engine")
        return self._requests[ref.key]

    def unload(self, ref: AdapterRef, in_use: set[str]) -> bool:
        if self._loaded.pop(ref.key, None) is None:
            return False
        self.forget_unused(in_use)
        return True

    def forget_unused(self, in_use: set[str]) -> None:
        """Let vLLM drop the adapters that are unloaded and that no running request uses."""
        for key in [k for k in self._requests if k not in self._loaded and k not in in_use]:
            self._llm.remove_lora(self._requests.pop(key).lora_int_id)
