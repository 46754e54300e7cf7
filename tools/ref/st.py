"""st.py - the safetensors file format, read and written with numpy only.

Owns: parsing single files and sharded checkpoints (model.safetensors.index.json) into raw
numpy arrays, and writing files that dsv4's strict C reader (src/io/safetensors.c) accepts:
tensors laid out back to back in declaration order, string-only __metadata__.

Why here: the reference must not depend on the `safetensors` package (not installable on the
project's machines) and must read the official HF layout exactly as released. Decoding of the
number formats (BF16, F8_E4M3, F8_E8M0, packed FP4) is numerics.py's job; this file only
returns the stored bytes with their declared dtype and shape.

Format: 8-byte little-endian header length N, N bytes of JSON (name -> {dtype, shape,
data_offsets [begin, end) relative to the data area}, optional "__metadata__": {str: str}),
then the data area.
"""

import json
import os
import struct

import numpy as np

# safetensors dtype name -> numpy dtype used to hold the raw stored elements
RAW_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_, "F8_E4M3": np.uint8, "F8_E5M2": np.uint8, "F8_E8M0": np.uint8,
}


class StoredTensor:
    """One tensor as stored: its safetensors dtype name and its raw elements (numpy)."""

    def __init__(self, dtype, array):
        self.dtype = dtype
        self.array = array

    @property
    def shape(self):
        return tuple(self.array.shape)


def read_file(path):
    """Returns (tensors {name: StoredTensor}, metadata {str: str}) of one .safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: too short for a safetensors header")
    (hlen,) = struct.unpack("<Q", blob[:8])
    if 8 + hlen > len(blob):
        raise ValueError(f"{path}: header length {hlen} runs past the end of the file")
    header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    data = memoryview(blob)[8 + hlen:]
    meta = header.pop("__metadata__", None) or {}
    out = {}
    for name, ent in header.items():
        dt = ent["dtype"]
        if dt not in RAW_DTYPES:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dt}")
        b, e = ent["data_offsets"]
        shape = tuple(int(s) for s in ent["shape"])
        arr = np.frombuffer(data[b:e], dtype=RAW_DTYPES[dt]).reshape(shape)
        out[name] = StoredTensor(dt, arr)
    return out, meta


def read_checkpoint(path):
    """Reads a checkpoint directory (index + shards, or model.safetensors, or every
    *.safetensors) or a single file. Returns {name: StoredTensor}."""
    if os.path.isfile(path):
        return read_file(path)[0]
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            wmap = json.load(f)["weight_map"]
        shards = sorted(set(wmap.values()))
    elif os.path.exists(os.path.join(path, "model.safetensors")):
        shards, wmap = ["model.safetensors"], None
    else:
        shards, wmap = sorted(n for n in os.listdir(path) if n.endswith(".safetensors")), None
    tensors = {}
    for shard in shards:
        part, _ = read_file(os.path.join(path, shard))
        for name, t in part.items():
            if name in tensors:
                raise ValueError(f"{path}: tensor {name} is in two shards")
            if wmap is not None and wmap.get(name) != shard:
                raise ValueError(f"{path}: tensor {name} found in {shard}, index says {wmap.get(name)}")
            tensors[name] = t
    if wmap is not None:
        missing = [n for n in wmap if n not in tensors]
        if missing:
            raise ValueError(f"{path}: index lists {len(missing)} tensors not in any shard, e.g. {missing[0]}")
    return tensors


# numpy dtype -> safetensors name, for writing
_WRITE_NAMES = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
                np.dtype(np.int64): "I64", np.dtype(np.int32): "I32", np.dtype(np.int16): "I16",
                np.dtype(np.int8): "I8", np.dtype(np.uint8): "U8", np.dtype(np.bool_): "BOOL"}


def _dtype_and_array(name, value):
    """A numpy array (dtype from its numpy dtype) or a (safetensors dtype name, raw array) pair
    for the formats numpy lacks: ("BF16", uint16 bits), ("F8_E4M3" / "F8_E8M0", uint8 codes)."""
    if isinstance(value, tuple):
        dt, arr = value
        arr = np.ascontiguousarray(arr)
        if dt not in RAW_DTYPES or np.dtype(RAW_DTYPES[dt]) != arr.dtype:
            raise ValueError(f"{name}: {dt} needs raw {RAW_DTYPES.get(dt)} elements, got {arr.dtype}")
        return dt, arr
    arr = np.ascontiguousarray(value)
    if arr.dtype not in _WRITE_NAMES:
        raise ValueError(f"{name}: cannot write numpy dtype {arr.dtype}")
    return _WRITE_NAMES[arr.dtype], arr


def write_file(path, tensors, metadata=None):
    """Writes {name: numpy array or (dtype name, raw array)} (insertion order kept) and optional
    {str: str} metadata. Zero-element tensors are not allowed (the project's reader wants a
    tiled data area)."""
    header, chunks, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, value in tensors.items():
        dt, arr = _dtype_and_array(name, value)
        if arr.size == 0:
            raise ValueError(f"{name}: zero-element tensor")
        raw = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape),
                        "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for c in chunks:
            f.write(c)
    os.replace(tmp, path)
