"""Where adapters may be loaded from, and the checksum that must match: each refusal has its code."""

import contextlib
import os
import shutil
import subprocess

import pytest

from engine.base.config import EngineConfig
from engine.base.errors import EngineError, ErrorCode
from engine.core.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine
from engine.lora.adapter import AdapterRef
from engine.lora.source import parse_checksum
from engine.model.loader import load_model
from engine.offline import make_request
from tests.helpers.lora_helpers import save_tiny_llama_with_adapters

SPECS = {"code": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])}


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model):
    """The model, and a root folder whose adapters/ holds the adapter; `outside` is next to the root."""
    base = tmp_path_factory.mktemp("lora-source")
    root, outside = base / "root", base / "outside"
    save_tiny_llama_with_adapters(base / "model", root / "adapters", tiny_model.tokenizer, SPECS)
    shutil.copytree(root / "adapters" / "code", outside / "code")
    return load_model(str(base / "model")), root, outside


def make_engine(world, **overrides) -> LLMEngine:
    model, root, _ = world
    settings = dict(chunk_size=64, max_chunk_per_gpu=4, max_loras=2, max_lora_rank=16, adapter_root=str(root)) | overrides
    return LLMEngine(model, EngineConfig(**settings))


def refused(engine, path, checksum=None, name="code", version="v1") -> EngineError:
    with pytest.raises(EngineError) as caught:
        engine.load_adapter(name, version, path, checksum)
    assert engine.adapter_keys == []
    return caught.value


def sha256sum(folder) -> str:
    """The checksum as an operator computes it, with coreutils."""
    files = [os.path.join(folder, "adapter_config.json"), os.path.join(folder, "adapter_model.safetensors")]
    cat = subprocess.run(["cat", *files], check=True, capture_output=True).stdout
    return subprocess.run(["sha256sum"], input=cat, check=True, capture_output=True).stdout.split()[0].decode()


def test_a_relative_or_an_absolute_path_under_the_root_loads(world):
    _, root, _ = world
    engine = make_engine(world)
    engine.load_adapter("code", "v1", "adapters/code")
    engine.load_adapter("code", "v2", str(root / "adapters" / "code"))
    assert engine.adapter_keys == ["code@v1", "code@v2"]


def test_the_checksum_of_the_files_is_accepted_in_either_spelling(world):
    _, root, _ = world
    digest = sha256sum(root / "adapters" / "code")
    engine = make_engine(world)
    engine.load_adapter("code", "v1", "adapters/code", f"sha256:{digest}")
    engine.load_adapter("code", "v2", "adapters/code", digest.upper())
    assert engine.adapter_keys == ["code@v1", "code@v2"]


def test_a_wrong_checksum_is_refused(world):
    _, root, _ = world
    digest = sha256sum(root / "adapters" / "code")
    wrong = ("0" if digest[0] != "0" else "1") + digest[1:]
    error = refused(make_engine(world), "adapters/code", f"sha256:{wrong}")
    assert error.code is ErrorCode.INVALID_ARGUMENT and digest in error.message and wrong in error.message


@pytest.mark.parametrize("checksum", ["md5:0123", "sha256:xyz", "sha256:" + "a" * 63, "a" * 65])
def test_a_malformed_checksum_is_refused(world, checksum):
    assert refused(make_engine(world), "adapters/code", checksum).code is ErrorCode.INVALID_ARGUMENT


def test_dot_dot_is_refused_even_when_it_stays_inside_the_root(world):
    error = refused(make_engine(world), "adapters/../adapters/code")
    assert error.code is ErrorCode.INVALID_ARGUMENT and "'..'" in error.message


def test_an_absolute_path_outside_the_root_is_refused(world):
    _, _, outside = world
    error = refused(make_engine(world), str(outside / "code"))
    assert error.code is ErrorCode.INVALID_ARGUMENT and "outside the adapter root" in error.message


def test_a_symlinked_folder_that_leads_outside_the_root_is_refused(world, tmp_path):
    _, root, outside = world
    link = root / "escape"
    link.symlink_to(outside / "code", target_is_directory=True)
    try:
        error = refused(make_engine(world), "escape")
    finally:
        link.unlink()
    assert error.code is ErrorCode.INVALID_ARGUMENT and "symlink" in error.message


@contextlib.contextmanager
def folder_with_only_the_config(root, name):
    """root/<name>/ holding the adapter's config and no weights yet; removed afterwards."""
    folder = root / name
    folder.mkdir()
    shutil.copy(root / "adapters" / "code" / "adapter_config.json", folder)
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


def test_a_symlinked_weights_file_that_leads_outside_the_root_is_refused(world):
    _, root, outside = world
    with folder_with_only_the_config(root, "sneaky") as folder:
        (folder / "adapter_model.safetensors").symlink_to(outside / "code" / "adapter_model.safetensors")
        error = refused(make_engine(world), "sneaky")
    assert error.code is ErrorCode.INVALID_ARGUMENT and "adapter_model.safetensors" in error.message


def test_a_missing_folder_or_file_is_not_found(world):
    _, root, _ = world
    assert refused(make_engine(world), "adapters/nothing-here").code is ErrorCode.ADAPTER_NOT_FOUND
    with folder_with_only_the_config(root, "half"):
        error = refused(make_engine(world), "half")
    assert error.code is ErrorCode.ADAPTER_NOT_FOUND and "adapter_model.safetensors" in error.message


def test_an_empty_path_or_an_unreadable_file_is_refused(world):
    _, root, _ = world
    assert refused(make_engine(world), "").code is ErrorCode.INVALID_ARGUMENT
    with folder_with_only_the_config(root, "unreadable") as folder:
        (folder / "adapter_model.safetensors").mkdir()  # a folder where the file should be
        error = refused(make_engine(world), "unreadable")
    assert error.code is ErrorCode.ADAPTER_NOT_FOUND and "cannot read adapter_model.safetensors" in error.message


def test_an_engine_without_an_adapter_root_or_without_slots_loads_nothing(world):
    assert refused(make_engine(world, adapter_root=None), "adapters/code").code is ErrorCode.INVALID_ARGUMENT
    error = refused(make_engine(world, max_loras=0), "adapters/code")
    assert error.code is ErrorCode.INVALID_ARGUMENT and "max_loras=0" in error.message


@pytest.mark.parametrize("name, version", [("", "v1"), ("code", ""), ("co@de", "v1")])
def test_a_bad_name_or_version_is_refused(world, name, version):
    assert refused(make_engine(world), "adapters/code", name=name, version=version).code is ErrorCode.INVALID_ARGUMENT


def test_loading_the_same_version_again_is_a_no_op_but_other_files_under_it_are_refused(world):
    _, root, _ = world
    engine = make_engine(world)
    first = engine.load_adapter("code", "v1", "adapters/code")
    assert engine.load_adapter("code", "v1", "adapters/code", sha256sum(root / "adapters" / "code")) is first
    with pytest.raises(EngineError) as caught:
        engine.load_adapter("code", "v1", str(root / "adapters" / "code"))
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT and "unload it" in caught.value.message


def test_a_request_for_an_adapter_that_is_not_loaded_is_not_found(world):
    engine = make_engine(world)
    engine.load_adapter("code", "v1", "adapters/code")
    for ref in (AdapterRef("code", "v2"), AdapterRef("other", "v1")):
        request = make_request(engine, [1, 2, 3], SamplingParams(max_tokens=2))
        request.adapter = ref
        with pytest.raises(EngineError) as caught:
            engine.add_request(request)
        assert caught.value.code is ErrorCode.ADAPTER_NOT_FOUND and ref.version in caught.value.message
    assert not engine.has_unfinished()


def test_parse_checksum_returns_the_bare_lowercase_digest():
    assert parse_checksum(" SHA256:" + "AB" * 32 + " ") == "ab" * 32
