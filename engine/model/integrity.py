"""Checking a model's files against the sha256 digests the operator expects, before loading.

Each file is named by its path relative to the model's folder: the Hugging Face folder, or
the folder holding the GGUF file (for `tiny-random`, the GGUF whose tokenizer it borrows).
Files are hashed in chunks, so a checkpoint of any size costs no more memory than a buffer."""

import hashlib
import os
from pathlib import PurePath

from common.model_source import ModelLoadError, resolve_model
from engine.base.errors import EngineError
from engine.lora.source import parse_checksum


def parse_model_checksums(specs: list[str]) -> dict[str, str]:
    """FILE=HEX strings (HEX bare or "sha256:"-prefixed) -> {relative path: hex digest}."""
    checksums = {}
    for spec in specs:
        path, sep, digest = spec.partition("=")
        if not sep or not path:
            raise ModelLoadError(f"--model-sha256 {spec!r}: expected FILE=HEX, e.g. model.safetensors=<64 hex digits>")
        if PurePath(path).is_absolute() or ".." in PurePath(path).parts:
            raise ModelLoadError(f"--model-sha256 {spec!r}: FILE must be a path inside the model's folder, without '..'")
        try:
            checksums[path] = parse_checksum(digest)
        except EngineError as error:
            raise ModelLoadError(f"--model-sha256 {spec!r}: {error.message}") from None
    return checksums


def model_folder(name_or_path: str) -> str:
    source = resolve_model(name_or_path)
    return source.path if source.kind == "hf" else os.path.dirname(source.path)


def file_sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def verify_model_files(name_or_path: str, checksums: dict[str, str]) -> None:
    """Raise ModelLoadError, naming the file, unless every file hashes to its expected digest."""
    folder = model_folder(name_or_path)
    for relative, expected in checksums.items():
        path = os.path.join(folder, relative)
        try:
            actual = file_sha256(path)
        except FileNotFoundError:
            raise ModelLoadError(f"model file {relative} missing from {folder} (expected sha256 {expected})") from None
        except OSError as exc:
            raise ModelLoadError(f"model file {path} unreadable: {exc.strerror or exc} (expected sha256 {expected})") from None
        if actual != expected:
            raise ModelLoadError(f"model file {path} has sha256 {actual}, expected {expected}: refusing to load it")
