"""Writing GGUF metadata in tests, with gguf-py's writer as the outside reference."""

import numpy as np
from gguf import GGUFWriter


def add_metadata(writer: GGUFWriter, metadata: dict) -> None:
    """Add key/values as read back by common.gguf_file (strings, bools, ints, arrays)."""
    for key, value in metadata.items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        else:
            writer.add_array(key, value.tolist() if isinstance(value, np.ndarray) else value)
