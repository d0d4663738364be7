"""Read .safetensors files by mmap, without copying the weights.

The format is an 8-byte little-endian header length, a JSON header {name: {dtype, shape,
data_offsets}}, then the raw tensor bytes. Reading it ourselves (rather than through a library
that hands back numpy copies) lets a BF16 checkpoint stay BF16 in memory: the kernels widen it.

The files come from the internet, so the header is checked as the safetensors format defines it
before anything is mapped: a length within the file, a JSON object with no key twice, for each
tensor a known dtype, a shape of non-negative integers and offsets that hold exactly its bytes,
inside the data section, overlapping no other tensor. Anything else is a WeightFileError naming
the file and the tensor.
"""
import math
import os
import struct
from pathlib import Path

import numpy as np

from ..errors import WeightFileError
from .jsonfile import parse_json, read_json
from .tensors import BF16, F16, F32, Tensor, row_bytes

DTYPES = {"F32": F32, "F16": F16, "BF16": BF16}
# The safetensors format's own bound on the header (the reference reader refuses longer ones).
MAX_HEADER_BYTES = 100 << 20


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def read_safetensors(path) -> dict:
    """{name: Tensor} for every tensor of one .safetensors file (views into a read-only mmap)."""
    path = Path(path)
    try:
        size = os.path.getsize(path)
        if size < 8:
            raise WeightFileError(f"{path}: {size} bytes, too short to be a safetensors file")
        raw = np.memmap(path, dtype=np.uint8, mode="r")
    except OSError as exc:
        raise WeightFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    (header_len,) = struct.unpack("<Q", bytes(raw[:8]))
    if header_len > raw.size - 8:
        raise WeightFileError(f"{path}: header length {header_len} runs past the end of the file "
                              f"({raw.size} bytes)")
    if header_len > MAX_HEADER_BYTES:
        raise WeightFileError(f"{path}: header of {header_len} bytes, more than the format's "
                              f"{MAX_HEADER_BYTES}")
    header = parse_json(bytes(raw[8:8 + header_len]), f"{path}: header", WeightFileError)
    if not isinstance(header, dict):
        raise WeightFileError(f"{path}: the header is not a JSON object")
    base = 8 + header_len
    data_size = raw.size - base
    tensors, spans = {}, []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        where = f"{path}: tensor {name!r}"[:300]
        if not isinstance(info, dict):
            raise WeightFileError(f"{where}: its entry is not an object")
        dtype = DTYPES.get(info.get("dtype")) if isinstance(info.get("dtype"), str) else None
        if dtype is None:
            raise WeightFileError(f"{where} has dtype {info.get('dtype')!r}; "
                                  f"supported: {', '.join(DTYPES)}"[:400])
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if not isinstance(shape, list) or len(shape) > 8 or not all(_is_int(d) and d >= 0 for d in shape):
            raise WeightFileError(f"{where}: shape {shape!r} is not a list of non-negative integers"[:400])
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(v) for v in offsets)):
            raise WeightFileError(f"{where}: data_offsets {offsets!r} is not a pair of integers"[:400])
        start, end = offsets
        n = math.prod(shape)
        if not 0 <= start <= end <= data_size:
            raise WeightFileError(f"{where}: data ({start}..{end}) lies outside the file's "
                                  f"{data_size} data bytes")
        if end - start != row_bytes(dtype, n):
            raise WeightFileError(f"{where}: data ({start}..{end}) does not match its shape {shape} "
                                  f"of {info['dtype']} ({row_bytes(dtype, n)} bytes)"[:400])
        spans.append((start, end, name))
        tensors[name] = Tensor(name, dtype, tuple(shape), raw[base + start:base + end], str(path))
    _check_no_overlap(path, spans)
    return tensors


def _check_no_overlap(path, spans):
    spans.sort()
    for (s0, e0, a), (s1, e1, b) in zip(spans, spans[1:]):
        if s1 < e0 and s1 < e1:  # empty tensors overlap nothing
            raise WeightFileError(f"{path}: tensors {a!r} and {b!r} share bytes "
                                  f"({s0}..{e0} and {s1}..{e1})"[:400])


def _shard_files(model_dir: Path, index: Path) -> dict:
    """{file name: [tensor names]} from a shard index, each file a plain name in model_dir."""
    weight_map = read_json(index, WeightFileError).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise WeightFileError(f"{index}: no 'weight_map' object naming the shards")
    files = {}
    for tensor, file in weight_map.items():
        # A shard is a file beside the index: no directories, no way out of the model directory.
        if not isinstance(file, str) or not file or os.path.basename(file) != file or file in (".", ".."):
            raise WeightFileError(f"{index}: tensor {tensor!r} is mapped to {file!r}, which is not a "
                                  f"file name in the model directory"[:400])
        files.setdefault(file, []).append(tensor)
    return files


def read_checkpoint(model_dir) -> dict:
    """All tensors of a model directory: model.safetensors, or the shards its index lists."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    listed = None
    if index.is_file():
        listed = _shard_files(model_dir, index)
        files = sorted(listed)
    elif (model_dir / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        files = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if not files:
        raise WeightFileError(f"{model_dir}: no *.safetensors weights found")
    tensors = {}
    for name in files:
        path = model_dir / name
        try:
            present = path.is_file()
        except OSError as e:  # a name the file system refuses (too long, ...): is_file lets that through
            raise WeightFileError(f"{index}: shard {name!r}"[:300] + f" cannot be opened: {e.strerror}") from None
        if not present:
            raise WeightFileError(f"{path}: listed in the shard index but missing")
        shard = read_safetensors(path)
        for tensor in shard:
            if tensor in tensors:
                raise WeightFileError(f"{path}: tensor {tensor!r}"[:300] + f" is also in {tensors[tensor].source}")
        if listed is not None:
            for tensor in listed[name]:
                if tensor not in shard:
                    raise WeightFileError(f"{index}: tensor {tensor!r} is listed in {name}, which does "
                                          f"not hold it"[:400])
        tensors.update(shard)
    return tensors
