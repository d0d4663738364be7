"""Read .safetensors files by mmap, without copying the weights.

The format is an 8-byte little-endian header length, a JSON header {name: {dtype, shape,
data_offsets}}, then the raw tensor bytes. Reading it ourselves (rather than through a library
that hands back numpy copies) lets a BF16 checkpoint stay BF16 in memory: the kernels widen it.
"""
import json
import struct
from pathlib import Path

import numpy as np

from ..errors import WeightFileError
from .tensors import BF16, F16, F32, Tensor, row_bytes

DTYPES = {"F32": F32, "F16": F16, "BF16": BF16}


def read_safetensors(path) -> dict:
    """{name: Tensor} for every tensor of one .safetensors file (views into a read-only mmap)."""
    path = Path(path)
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    if raw.size < 8:
        raise WeightFileError(f"{path}: too short to be a safetensors file")
    (header_len,) = struct.unpack("<Q", bytes(raw[:8]))
    if header_len > raw.size - 8:
        raise WeightFileError(f"{path}: header length {header_len} runs past the end of the file")
    try:
        header = json.loads(bytes(raw[8:8 + header_len]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WeightFileError(f"{path}: unreadable header ({exc})") from None
    base = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise WeightFileError(f"{path}: tensor {name} has dtype {info.get('dtype')}; "
                                  f"supported: {', '.join(DTYPES)}")
        shape = tuple(int(d) for d in info["shape"])
        start, end = (int(v) for v in info["data_offsets"])
        n = int(np.prod(shape)) if shape else 1
        if end - start != row_bytes(dtype, n) or base + end > raw.size or start < 0:
            raise WeightFileError(f"{path}: tensor {name} data ({start}..{end}) does not match its "
                                  f"shape {list(shape)} or lies outside the file")
        tensors[name] = Tensor(name, dtype, shape, raw[base + start:base + end], str(path))
    return tensors


def read_checkpoint(model_dir) -> dict:
    """All tensors of a model directory: model.safetensors, or the shards its index lists."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted(set(weight_map.values()))
    elif (model_dir / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        files = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if not files:
        raise WeightFileError(f"{model_dir}: no *.safetensors weights found")
    tensors = {}
    for name in files:
        path = model_dir / name
        if not path.is_file():
            raise WeightFileError(f"{path}: listed in the shard index but missing")
        tensors.update(read_safetensors(path))
    return tensors
