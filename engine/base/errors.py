"""Errors the engine reports to its callers; codes are the names of proto's ErrorCode."""

import enum


class ErrorCode(str, enum.Enum):
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    CHUNK_SIZE_MISMATCH = "CHUNK_SIZE_MISMATCH"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    ADAPTER_NOT_FOUND = "ADAPTER_NOT_FOUND"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    CANCELLED = "CANCELLED"
    INTERNAL = "INTERNAL"


class EngineError(Exception):
    """A request the engine will not run (or stopped running), with the code callers act on."""

    def __init__(self, code: ErrorCode, message: str):
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message


class EngineConfigError(Exception):
    """The engine cannot start with this configuration (e.g. the KV cache does not fit)."""
