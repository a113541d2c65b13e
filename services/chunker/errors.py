"""The chunker's refusals: a code from proto's ErrorCode enum (by name) and a message."""

from proto import k25_pb2


class ChunkerError(Exception):
    def __init__(self, code: str, message: str):
        if code not in k25_pb2.ErrorCode.keys():
            raise ValueError(f"{code!r} is not a k25.v1.ErrorCode")
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def invalid_argument(message: str) -> ChunkerError:
    return ChunkerError("INVALID_ARGUMENT", message)
