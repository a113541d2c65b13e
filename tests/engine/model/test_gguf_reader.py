"""common.gguf_file and engine.model.gguf_dequant against gguf-py, the reference library: the SmolLM2
GGUF, every metadata value type, every supported tensor type's blocks, and random bytes after a
valid header."""

import time

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, quants

from common.gguf_file import BLOCK_LAYOUT, GGUFError, GGUFFile, TensorType
from engine.model.gguf_dequant import SUPPORTED_TYPES, dequantize


def test_reader_matches_gguf_py_on_smollm2(smollm2_gguf):
    start = time.perf_counter()
    ours = GGUFFile(smollm2_gguf)
    took = time.perf_counter() - start
    print(f"GGUFFile(SmolLM2) metadata + tensor infos: {took:.3f} s")
    reference = GGUFReader(smollm2_gguf)
    keys = [k for k in reference.fields if not k.startswith("GGUF.")]
    assert keys == list(ours.metadata)
    for key in keys:
        value = ours.metadata[key]
        assert (value.tolist() if isinstance(value, np.ndarray) else value) == reference.fields[key].contents(), key
    assert [t.name for t in reference.tensors] == list(ours.tensors)
    for t in reference.tensors:
        info = ours.tensors[t.name]
        assert (info.type, info.shape, info.offset, info.nbytes) == (
            t.tensor_type, tuple(int(d) for d in reversed(t.shape)), t.data_offset, t.n_bytes)
    emb = reference.tensors[0]
    assert np.array_equal(ours.tensor_bytes(emb.name), emb.data.view(np.uint8).reshape(-1))


def test_reader_reads_every_value_type(tmp_path):
    path = str(tmp_path / "kv.gguf")
    writer = GGUFWriter(path, "llama")
    values = {
        "t.u8": (7, GGUFValueType.UINT8), "t.i8": (-7, GGUFValueType.INT8),
        "t.u16": (65535, GGUFValueType.UINT16), "t.i16": (-300, GGUFValueType.INT16),
        "t.u32": (4_000_000_000, GGUFValueType.UINT32), "t.i32": (-5, GGUFValueType.INT32),
        "t.f32": (0.5, GGUFValueType.FLOAT32), "t.bool": (True, GGUFValueType.BOOL),
        "t.str": ("héllo ✓", GGUFValueType.STRING), "t.u64": (2**63 + 1, GGUFValueType.UINT64),
        "t.i64": (-(2**40), GGUFValueType.INT64), "t.f64": (1e-300, GGUFValueType.FLOAT64),
    }
    for key, (value, vtype) in values.items():
        writer.add_key_value(key, value, vtype)
    writer.add_key_value("t.arr_f32", [1.5, -2.0], GGUFValueType.ARRAY, sub_type=GGUFValueType.FLOAT32)
    writer.add_key_value("t.arr_bool", [True, False], GGUFValueType.ARRAY, sub_type=GGUFValueType.BOOL)
    writer.add_key_value("t.arr_str", ["a", "", "ü"], GGUFValueType.ARRAY)
    writer.add_key_value("t.nested", [[1, 2], [3]], GGUFValueType.ARRAY)
    writer.add_custom_alignment(64)
    writer.add_tensor("x", np.arange(6, dtype=np.float32).reshape(2, 3))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    f = GGUFFile(path)
    for key, (value, _) in values.items():
        assert f.metadata[key] == value and type(f.metadata[key]) is type(value), key
    assert f.metadata["t.arr_f32"].tolist() == [1.5, -2.0]
    assert f.metadata["t.arr_bool"].tolist() == [True, False]
    assert f.metadata["t.arr_str"] == ["a", "", "ü"]
    assert [a.tolist() for a in f.metadata["t.nested"]] == [[1, 2], [3]]
    assert f.alignment == 64 and f.tensors["x"].offset % 64 == 0 and f.tensors["x"].shape == (2, 3)
    assert f.tensor_bytes("x").view(np.float32).tolist() == [0, 1, 2, 3, 4, 5]


def _random_tensor_bytes(name: str, rng) -> np.ndarray:
    """Random bytes for 16k weights of a type, with every fp16 scale kept finite (NaN never compares)."""
    ttype = TensorType[name]
    per_block, block_bytes = BLOCK_LAYOUT[ttype]
    n_blocks = 16384 // per_block
    if per_block == 1:  # plain floats
        values = rng.normal(size=n_blocks).astype(np.float32)
        if name == "F16":
            values = values.astype(np.float16)
        elif name == "BF16":
            values = (values.view(np.uint32) >> 16).astype(np.uint16)
        return values.view(np.uint8)
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    scales = {"Q6_K": [208], "Q4_0": [0], "Q5_0": [0], "Q8_0": [0]}.get(name, [0, 2])
    for at in scales:
        raw[:, at : at + 2] = rng.normal(size=(n_blocks, 1)).astype(np.float16).view(np.uint8)
    return raw.reshape(-1)


@pytest.mark.parametrize("name", sorted(SUPPORTED_TYPES))
def test_dequantize_matches_gguf_py_on_random_blocks(name):
    raw = _random_tensor_bytes(name, np.random.default_rng(int(TensorType[name])))
    expected = quants.dequantize(raw.copy(), GGMLQuantizationType[name]).reshape(-1).astype(np.float32)
    ours = dequantize(raw.copy(), int(TensorType[name]), (16384,))
    assert ours.dtype == torch.float32
    np.testing.assert_array_equal(ours.numpy(), expected)


def test_random_bytes_after_a_valid_header_never_escape_as_other_errors(tmp_path):
    rng = np.random.default_rng(1)
    path = tmp_path / "fuzz.gguf"
    for i in range(300):
        counts = rng.integers(0, 40, 2).astype("<u8").tobytes()
        path.write_bytes(b"GGUF\x03\x00\x00\x00" + counts + rng.integers(0, 256, int(rng.integers(0, 600)),
                                                                          dtype=np.uint8).tobytes())
        try:
            GGUFFile(str(path))
        except GGUFError as e:
            assert str(path) in str(e)
