"""`--model-sha256 FILE=HEX`: parsing, and checking a model folder's files before loading. The
real SmolLM2 GGUF and a Hugging Face folder on disk; `k25 engine` refusing to start is in
test_engine_server.py."""

import hashlib
import os

import pytest

from common.model_source import ModelLoadError
from engine.model.integrity import file_sha256, model_folder, parse_model_checksums, verify_model_files

DIGEST = "ab" * 32


@pytest.mark.parametrize("specs, expected", [
    ([], {}),
    ([f"model.safetensors={DIGEST}"], {"model.safetensors": DIGEST}),
    ([f"sub/model-00001.safetensors=sha256:{DIGEST.upper()}", f"config.json={'0' * 64}"],
     {"sub/model-00001.safetensors": DIGEST, "config.json": "0" * 64}),
])
def test_parse(specs, expected):
    assert parse_model_checksums(specs) == expected


@pytest.mark.parametrize("spec, fragment", [
    ("model.safetensors", "expected FILE=HEX"),
    (f"={DIGEST}", "expected FILE=HEX"),
    ("model.safetensors=abc", "64 hex digits"),
    (f"/etc/passwd={DIGEST}", "inside the model's folder"),
    (f"../other/model.safetensors={DIGEST}", "inside the model's folder"),
])
def test_parse_refuses_what_names_no_file_in_the_folder_or_no_digest(spec, fragment):
    with pytest.raises(ModelLoadError, match=fragment) as info:
        parse_model_checksums([spec])
    assert spec in str(info.value)


@pytest.fixture
def hf_folder(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    weights = os.urandom(3 * (1 << 20) + 17)  # bigger than one read: hashed in chunks, the same digest
    (tmp_path / "model.safetensors").write_bytes(weights)
    return tmp_path, hashlib.sha256(weights).hexdigest()


def test_matching_files_pass(hf_folder):
    folder, digest = hf_folder
    assert file_sha256(str(folder / "model.safetensors")) == digest
    verify_model_files(str(folder), {"model.safetensors": digest, "config.json": hashlib.sha256(b"{}").hexdigest()})


def test_a_mismatch_names_the_file_the_expected_and_the_actual_digest(hf_folder):
    folder, digest = hf_folder
    with pytest.raises(ModelLoadError) as info:
        verify_model_files(str(folder), {"model.safetensors": DIGEST})
    message = str(info.value)
    assert str(folder / "model.safetensors") in message and f"has sha256 {digest}" in message
    assert f"expected {DIGEST}" in message and "\n" not in message


def test_a_missing_file_is_named(hf_folder):
    folder, _ = hf_folder
    with pytest.raises(ModelLoadError, match=f"model-00002.safetensors missing from {folder} \\(expected sha256 {DIGEST}\\)"):
        verify_model_files(str(folder), {"model-00002.safetensors": DIGEST})


def test_the_folder_of_a_gguf_model_is_the_one_holding_the_file(smollm2_gguf):
    assert model_folder("smollm2-135m") == model_folder("tiny-random") == os.path.dirname(smollm2_gguf)
    assert model_folder(smollm2_gguf) == os.path.dirname(smollm2_gguf)
