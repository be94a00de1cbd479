"""Minimal safetensors reader/writer on numpy (no `safetensors` package needed).

File layout (docs/model-format.md §1): 8-byte little-endian header length, JSON header mapping each tensor
name to {dtype, shape, data_offsets [begin, end)} relative to the end of the header, then the raw data.
BF16 has no numpy dtype: it is carried as uint16 bit patterns, tagged with the dtype string "BF16".
"""
import json
import struct

import numpy as np

NUMPY_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32,
                "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BF16": np.uint16, "F8_E4M3": np.uint8,
                "F8_E8M0": np.uint8}


class Tensor:
    """A tensor as stored: the dtype string and the numpy array of its stored bits/values."""

    def __init__(self, dtype, array):
        if dtype not in NUMPY_DTYPES:
            raise ValueError(f"unsupported safetensors dtype {dtype}")
        self.dtype, self.array = dtype, np.ascontiguousarray(array, dtype=NUMPY_DTYPES[dtype])

    def to_float32(self):
        if self.dtype == "BF16":
            return (self.array.astype(np.uint32) << 16).view(np.float32)
        if self.dtype in ("F32", "F16", "F64"):
            return self.array.astype(np.float32)
        raise ValueError(f"no float conversion for {self.dtype}")


def float32_to_bf16_bits(array):
    """Round-to-nearest-even float32 -> bf16 bit patterns (NaN kept as a quiet NaN)."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(array)
    rounded[nan] = 0x7FC0
    return rounded


def load(path):
    """name -> Tensor, in file order."""
    with open(path, "rb") as f:
        return parse(f.read(), path)


def parse(data, path):
    """name -> Tensor of a safetensors file's bytes (path names it in errors)."""
    if len(data) < 8:
        raise ValueError(f"{path}: too short for a safetensors header")
    (header_len,) = struct.unpack("<Q", data[:8])
    if 8 + header_len > len(data):
        raise ValueError(f"{path}: header length {header_len} runs past the end of the file")
    header = json.loads(data[8:8 + header_len])
    base = 8 + header_len
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        numpy_dtype = np.dtype(NUMPY_DTYPES[dtype])
        count = int(np.prod(shape)) if shape else 1
        if end - begin != count * numpy_dtype.itemsize or base + end > len(data):
            raise ValueError(f"{path}: tensor {name}: data_offsets {begin}..{end} do not fit shape {shape} {dtype}")
        array = np.frombuffer(data, dtype=numpy_dtype, count=count, offset=base + begin).reshape(shape)
        out[name] = Tensor(dtype, array)
    return out


def save(path, tensors, metadata=None):
    """tensors: name -> Tensor. Data is laid out back to back in the given order (the format allows no gaps);
    the header is padded with spaces so the data starts 8-byte aligned."""
    header, offset, blobs = {}, 0, []
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, tensor in tensors.items():
        blob = tensor.array.astype(tensor.array.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": tensor.dtype, "shape": list(tensor.array.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * ((-len(header_bytes)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for blob in blobs:
            f.write(blob)


def load_checkpoint_tensors(directory):
    """All tensors of a checkpoint directory: model.safetensors, or the shards its index lists."""
    import os
    index_path = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    out = {}
    for shard in shards:
        out.update(load(os.path.join(directory, shard)))
    return out
