"""A small reader for GGUF files (versions 2 and 3, little-endian).

Layout: magic "GGUF", version, tensor count, metadata count, the metadata key/values, the
tensor infos, padding to `general.alignment`, then the tensor data. Metadata is parsed eagerly
(numeric arrays with numpy, so a 49k-token vocabulary costs milliseconds); tensor data stays on
disk in a copy-on-write numpy.memmap until someone asks for a tensor's bytes.

No torch here: the gateway uses this to read a tokenizer.
"""

import mmap
import struct
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32


class GGUFError(ValueError):
    """The file is not a GGUF we can read: bad magic, unknown type, truncated, inconsistent."""


class ValueType(IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


_SCALAR_DTYPES = {
    ValueType.UINT8: np.dtype("<u1"),
    ValueType.INT8: np.dtype("<i1"),
    ValueType.UINT16: np.dtype("<u2"),
    ValueType.INT16: np.dtype("<i2"),
    ValueType.UINT32: np.dtype("<u4"),
    ValueType.INT32: np.dtype("<i4"),
    ValueType.FLOAT32: np.dtype("<f4"),
    ValueType.BOOL: np.dtype("u1"),
    ValueType.UINT64: np.dtype("<u8"),
    ValueType.INT64: np.dtype("<i8"),
    ValueType.FLOAT64: np.dtype("<f8"),
}


class TensorType(IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39


# (weights per block, bytes per block), as ggml lays them out
BLOCK_LAYOUT = {
    TensorType.F32: (1, 4),
    TensorType.F16: (1, 2),
    TensorType.BF16: (1, 2),
    TensorType.F64: (1, 8),
    TensorType.I8: (1, 1),
    TensorType.I16: (1, 2),
    TensorType.I32: (1, 4),
    TensorType.I64: (1, 8),
    TensorType.Q4_0: (32, 18),
    TensorType.Q4_1: (32, 20),
    TensorType.Q5_0: (32, 22),
    TensorType.Q5_1: (32, 24),
    TensorType.Q8_0: (32, 34),
    TensorType.Q8_1: (32, 36),
    TensorType.Q2_K: (256, 84),
    TensorType.Q3_K: (256, 110),
    TensorType.Q4_K: (256, 144),
    TensorType.Q5_K: (256, 176),
    TensorType.Q6_K: (256, 210),
    TensorType.Q8_K: (256, 292),
    TensorType.IQ2_XXS: (256, 66),
    TensorType.IQ2_XS: (256, 74),
    TensorType.IQ3_XXS: (256, 98),
    TensorType.IQ1_S: (256, 50),
    TensorType.IQ4_NL: (32, 18),
    TensorType.IQ3_S: (256, 110),
    TensorType.IQ2_S: (256, 82),
    TensorType.IQ4_XS: (256, 136),
    TensorType.IQ1_M: (256, 56),
    TensorType.TQ1_0: (256, 54),
    TensorType.TQ2_0: (256, 66),
    TensorType.MXFP4: (32, 17),
}


def tensor_type_name(raw: int) -> str:
    try:
        return TensorType(raw).name
    except ValueError:
        return f"type#{raw}"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order (slowest axis first): ggml's ne reversed
    type: int  # a TensorType value; may be one this module does not name
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return tensor_type_name(self.type)

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class _Cursor:
    """Bounds-checked little-endian reads over a buffer; any overrun is a GGUFError."""

    def __init__(self, buf, path: str):
        self.buf, self.pos, self.path = buf, 0, path

    def _need(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > len(self.buf):
            raise GGUFError(f"{self.path}: truncated (wanted {n} bytes at offset {start}, file has {len(self.buf)})")
        self.pos = start + n
        return start

    def scalar(self, fmt: str):
        start = self._need(struct.calcsize(fmt))
        return struct.unpack_from(fmt, self.buf, start)[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        start = self._need(n)
        try:
            return str(self.buf[start : start + n], "utf-8")
        except UnicodeDecodeError as e:
            raise GGUFError(f"{self.path}: string at offset {start} is not UTF-8 ({e.reason})") from None

    def array(self, dtype: np.dtype, count: int) -> np.ndarray:
        start = self._need(count * dtype.itemsize)
        return np.frombuffer(self.buf, dtype=dtype, count=count, offset=start).copy()

    def value(self, vtype: int):
        if vtype == ValueType.STRING:
            return self.string()
        if vtype == ValueType.ARRAY:
            etype, count = self.scalar("<I"), self.scalar("<Q")
            if etype == ValueType.STRING:
                return [self.string() for _ in range(count)]
            if etype == ValueType.ARRAY:  # each element carries its own element type and count
                return [self.value(ValueType.ARRAY) for _ in range(count)]
            dtype = self._dtype(etype)
            arr = self.array(dtype, count)
            return arr.astype(bool) if etype == ValueType.BOOL else arr
        dtype = self._dtype(vtype)
        start = self._need(dtype.itemsize)
        v = np.frombuffer(self.buf, dtype=dtype, count=1, offset=start)[0].item()
        return bool(v) if vtype == ValueType.BOOL else v

    def _dtype(self, vtype: int) -> np.dtype:
        try:
            return _SCALAR_DTYPES[ValueType(vtype)]
        except (ValueError, KeyError):
            raise GGUFError(f"{self.path}: unknown metadata value type {vtype} at offset {self.pos}") from None


class GGUFFile:
    """An open GGUF file: `metadata` (key -> value), `tensors` (name -> TensorInfo), `tensor_bytes(name)`.

    String arrays come back as lists of str, numeric arrays as numpy arrays, scalars as Python values.
    """

    def __init__(self, path: str):
        self.path = str(path)
        try:
            with open(self.path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # mmap of an empty file
            raise GGUFError(f"{self.path}: empty file, not a GGUF") from None
        self._data = None
        try:
            self._parse(_Cursor(self._map, self.path))
        finally:
            self._map.close()  # everything parsed is a copy; tensor data is mapped again on demand

    def _parse(self, cur: _Cursor) -> None:
        self.file_size = len(cur.buf)
        if self.file_size < 4 or cur.buf[:4] != MAGIC:
            raise GGUFError(f"{self.path}: not a GGUF file (magic is {bytes(cur.buf[:4])!r}, expected {MAGIC!r})")
        cur.pos = 4
        self.version = cur.scalar("<I")
        if self.version not in (2, 3):
            raise GGUFError(f"{self.path}: GGUF version {self.version} is not supported (only 2 and 3)")
        n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
        # each entry takes at least a dozen bytes, so larger counts mean garbage, not a big file
        if n_kv > self.file_size // 12 or n_tensors > self.file_size // 24:
            raise GGUFError(f"{self.path}: implausible counts ({n_kv} metadata keys, {n_tensors} tensors)")

        self.metadata: dict = {}
        for _ in range(n_kv):
            key = cur.string()
            self.metadata[key] = cur.value(cur.scalar("<I"))

        self.alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        if self.alignment <= 0 or self.alignment % 8:
            raise GGUFError(f"{self.path}: bad general.alignment {self.alignment}")

        raw = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.scalar("<I")
            if n_dims > 8:
                raise GGUFError(f"{self.path}: tensor {name!r} has {n_dims} dimensions")
            dims = tuple(int(cur.scalar("<Q")) for _ in range(n_dims))
            raw.append((name, dims, cur.scalar("<I"), cur.scalar("<Q")))
        self.data_offset = -(-cur.pos // self.alignment) * self.alignment

        self.tensors: dict[str, TensorInfo] = {}
        for name, dims, ttype, rel in raw:
            nbytes = self._nbytes(name, dims, ttype)
            info = TensorInfo(name, tuple(reversed(dims)), ttype, self.data_offset + rel, nbytes)
            if info.offset + info.nbytes > self.file_size:
                raise GGUFError(
                    f"{self.path}: truncated: tensor {name!r} needs bytes {info.offset}..{info.offset + info.nbytes}"
                    f" but the file has {self.file_size}"
                )
            self.tensors[name] = info

    def _nbytes(self, name: str, dims: tuple[int, ...], ttype: int) -> int:
        try:
            per_block, block_bytes = BLOCK_LAYOUT[TensorType(ttype)]
        except (ValueError, KeyError):
            raise GGUFError(f"{self.path}: tensor {name!r} has unknown type {ttype}") from None
        n = 1
        for d in dims:
            n *= d
        if dims and dims[0] % per_block:
            raise GGUFError(f"{self.path}: tensor {name!r} row of {dims[0]} is not a multiple of {per_block}")
        return n // per_block * block_bytes

    def tensor_bytes(self, name: str) -> np.ndarray:
        """The tensor's raw bytes, a writable (copy-on-write) uint8 view into the file."""
        info = self.tensors[name]
        if self._data is None:
            self._data = np.memmap(self.path, dtype=np.uint8, mode="c")
        return self._data[info.offset : info.offset + info.nbytes]

    def close(self) -> None:
        self._data = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
