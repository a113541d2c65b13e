"""Reading an adapter's files from under the adapter root, and checking their checksum.

A source is a folder under one configured root, given relative to it or as an absolute
path inside it; `..` anywhere, and symlinks that lead outside the root, are refused. The
checksum is sha256 over adapter_config.json's bytes followed by adapter_model.safetensors'
bytes (`cat adapter_config.json adapter_model.safetensors | sha256sum`), written as
"sha256:<hex>" or bare hex. Files are read once into memory, and the bytes that were
hashed are the bytes that are parsed."""

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path, PurePath

from engine.base.errors import EngineError, ErrorCode

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

_SHA256 = re.compile(r"(?:sha256:)?([0-9a-f]{64})")


@dataclass(frozen=True)
class AdapterFiles:
    directory: Path  # resolved
    config: bytes
    weights: bytes

    @property
    def sha256(self) -> str:
        digest = hashlib.sha256(self.config)
        digest.update(self.weights)
        return digest.hexdigest()


def parse_checksum(checksum: str) -> str:
    """The hex digest of a "sha256:<hex>" or bare-hex checksum."""
    match = _SHA256.fullmatch(checksum.strip().lower())
    if match is None:
        raise EngineError(ErrorCode.INVALID_ARGUMENT, f"checksum {checksum!r} is not 'sha256:' followed by 64 hex digits")
    return match.group(1)


def read_checked_files(root: str | None, key: str, path: str, checksum: str | None) -> AdapterFiles:
    """The adapter `key`'s files under `root`, refused unless they hash to `checksum` when one is given."""
    expected = parse_checksum(checksum) if checksum else None
    files = read_adapter_files(root, path)
    if expected is not None and files.sha256 != expected:
        raise EngineError(
            ErrorCode.INVALID_ARGUMENT, f"adapter {key} at {path!r} has sha256 {files.sha256}, expected {expected}"
        )
    return files


def read_adapter_files(root: str | None, path: str) -> AdapterFiles:
    directory = _resolve_under_root(root, path)
    root_real = Path(root).resolve()
    return AdapterFiles(directory, _read(directory / CONFIG_FILE, root_real, path), _read(directory / WEIGHTS_FILE, root_real, path))


def _resolve_under_root(root: str | None, path: str) -> Path:
    invalid = ErrorCode.INVALID_ARGUMENT
    if not root:
        raise EngineError(invalid, "this engine has no adapter root configured, so it loads no adapters")
    if not path:
        raise EngineError(invalid, "the adapter path is empty")
    given = PurePath(path)
    if ".." in given.parts:
        raise EngineError(invalid, f"adapter path {path!r} must not contain '..'")
    root_path, root_real = Path(root).absolute(), Path(root).resolve()
    if given.is_absolute() and not (Path(given).is_relative_to(root_path) or Path(given).is_relative_to(root_real)):
        raise EngineError(invalid, f"adapter path {path!r} is outside the adapter root {root}")
    directory = (root_path / given).resolve()
    if not directory.is_relative_to(root_real):
        raise EngineError(invalid, f"adapter path {path!r} leads outside the adapter root {root} (through a symlink)")
    if not directory.is_dir():
        raise EngineError(ErrorCode.ADAPTER_NOT_FOUND, f"no adapter folder at {path!r} under the adapter root {root}")
    return directory


def _read(file: Path, root_real: Path, path: str) -> bytes:
    if not file.resolve().is_relative_to(root_real):
        raise EngineError(ErrorCode.INVALID_ARGUMENT, f"{file.name} of adapter {path!r} links outside the adapter root")
    try:
        return file.read_bytes()
    except FileNotFoundError:
        raise EngineError(ErrorCode.ADAPTER_NOT_FOUND, f"adapter {path!r} has no {file.name}") from None
    except OSError as exc:
        raise EngineError(ErrorCode.ADAPTER_NOT_FOUND, f"cannot read {file.name} of adapter {path!r}: {exc}") from None
