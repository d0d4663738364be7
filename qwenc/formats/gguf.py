"""GGUF reader: metadata, tensor table and zero-copy tensor views, plus the mapping to HF names.

A GGUF file (versions 2 and 3; little-endian) is laid out as

    magic "GGUF" | version u32 | tensor count u64 | metadata count u64
    metadata:  key string | value type u32 | value            (repeated)
    tensors:   name string | n_dims u32 | dims u64 x n_dims | GGML type u32 | offset u64
    padding to `general.alignment` (default 32), then the tensor data

where a string is a u64 byte length and UTF-8 bytes, and an array value is an element type u32,
a u64 count and the elements (which may themselves be arrays). dims run fastest-first (ne0 is
the row length), the reverse of the HF/numpy shape. Offsets are relative to the data section.

The file is mapped read-only and tensor data is never copied: `tensor_bytes` returns a uint8
view into the mapping, which the row kernels read in place. Anything inconsistent (bad magic,
an unsupported version, a value or tensor type this reader does not know, a read past the end,
tensor data out of bounds) raises GGUFError naming the file.

A model may be split over several files (llama.cpp's gguf-split): `NAME-00001-of-0000N.gguf` ...
`NAME-0000N-of-0000N.gguf`, each a complete GGUF holding some of the tensors, with `split.no`
(u16, from 0), `split.count` (u16) and `split.tensors.count` (i32, the total) in every header and
the model's metadata in the first. `open_gguf` on the first part opens all of them, each mapped
on its own, and presents one tensor table (`GGUFSplit`); nothing is merged or copied.
"""
import mmap
import os
import re
import struct
from dataclasses import dataclass

import numpy as np

from ..errors import GGUFError
from .tensors import Tensor

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML tensors have at most 4 dimensions
# Bounds on what one header field may make qwenc build, far above any real file's, so that a
# length or count that the file's size allows (a large file, or a sparse one) still cannot make
# Python objects of gigabytes: GGML names tensors in at most 63 bytes; the largest string in real
# files is an embedded tokenizer.json of ~10 MB; the largest arrays are vocabularies of ~256k.
MAX_NAME_BYTES = 1 << 16
MAX_STRING_BYTES = 64 << 20
MAX_ARRAY_ITEMS = 1 << 24

# Metadata value types.
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)

# Fixed-size value types: struct format (little-endian) and numpy dtype for arrays of them.
_SCALAR = {
    UINT8: ("<B", np.uint8), INT8: ("<b", np.int8), UINT16: ("<H", np.uint16), INT16: ("<h", np.int16),
    UINT32: ("<I", np.uint32), INT32: ("<i", np.int32), FLOAT32: ("<f", np.float32),
    BOOL: ("<?", np.bool_), UINT64: ("<Q", np.uint64), INT64: ("<q", np.int64), FLOAT64: ("<d", np.float64),
}

# GGML tensor types: code -> (name, elements per block, bytes per block). Every type a GGUF may
# hold is listed so that the data section can be bounds-checked; which of them the kernels can
# compute with is a separate question (qwenc.tensors.BLOCK).
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}
# (Q8_1, code 9, is left out: it is an in-memory type that files never store.)


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    dtype: int            # GGML type code
    shape: tuple          # GGUF order: ne0 (the contiguous row length) first
    offset: int           # absolute byte offset of the data in the file
    nbytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class _Cursor:
    """Sequential little-endian reads from the mapped header, each checked against the file end."""

    def __init__(self, buf, path):
        self.buf = buf
        self.size = len(buf)
        self.pos = 0
        self.path = path

    def error(self, msg):
        return GGUFError(f"{self.path}: {msg}")

    def need(self, count, min_bytes, what):
        """Refuse `count` items of at least `min_bytes` each when the file cannot hold them, before
        anything is allocated for them (a hostile count must not cost memory)."""
        left = self.size - self.pos
        if count * min_bytes > left:
            raise self.error(f"truncated file: {count} {what} need at least {count * min_bytes} bytes, "
                             f"{left} are left")

    def take(self, n):
        """Advance over n bytes, returning where they start."""
        start = self.pos
        if n < 0 or start + n > self.size:
            raise self.error(f"truncated file: needs {start + n} bytes, has {self.size}")
        self.pos = start + n
        return start

    def scalar(self, vtype):
        fmt, _ = _SCALAR[vtype]
        start = self.take(struct.calcsize(fmt))
        return struct.unpack_from(fmt, self.buf, start)[0]

    def u32(self):
        return self.scalar(UINT32)

    def u64(self):
        return self.scalar(UINT64)

    def string(self, limit=MAX_STRING_BYTES, what="string"):
        n = self.u64()
        start = self.take(n)  # first, so that a length the file cannot hold says so
        if n > limit:
            raise self.error(f"{what} of {n} bytes at byte {start - 8} (at most {limit})")
        # Exact round trip: bytes that are not UTF-8 survive as lone surrogates.
        return bytes(self.buf[start:start + n]).decode("utf-8", errors="surrogateescape")

    def value(self, vtype, depth=0):
        if vtype in _SCALAR:
            return self.scalar(vtype)
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            return self.array(depth)
        raise self.error(f"unknown metadata value type {vtype} at byte {self.pos - 4}")

    def array(self, depth):
        if depth > 16:  # no real file nests this deep; refuse rather than recurse without end
            raise self.error("metadata arrays nested too deeply")
        etype = self.u32()
        count = self.u64()
        at = self.pos - 8

        def bounded():  # after the size checks, so a count the file cannot hold says so
            if count > MAX_ARRAY_ITEMS:
                raise self.error(f"metadata array of {count} items at byte {at} (at most {MAX_ARRAY_ITEMS})")

        if etype in _SCALAR:
            _, dtype = _SCALAR[etype]
            itemsize = np.dtype(dtype).itemsize
            start = self.take(count * itemsize)
            bounded()
            # Fixed-size elements in one go; tolist() gives Python ints/floats/bools.
            return np.frombuffer(self.buf, dtype=np.dtype(dtype).newbyteorder("<"), count=count,
                                 offset=start).tolist()
        if etype == STRING:
            self.need(count, 8, "strings")
            bounded()
            return self.string_array(count)
        if etype == ARRAY:
            self.need(count, 12, "arrays")
            bounded()
            return [self.array(depth + 1) for _ in range(count)]
        raise self.error(f"unknown metadata array element type {etype} at byte {self.pos - 12}")

    def string_array(self, count):
        # The vocabulary arrays hold ~150k strings: unpack lengths directly rather than through
        # the general path.
        buf, size, pos = self.buf, self.size, self.pos
        out = []
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.take(8)  # raises the truncation error
            n = unpack(buf, pos)[0]
            pos += 8
            if pos + n > size:
                self.pos = pos
                self.take(n)
            if n > MAX_STRING_BYTES:
                raise self.error(f"string of {n} bytes at byte {pos - 8} (at most {MAX_STRING_BYTES})")
            out.append(bytes(buf[pos:pos + n]).decode("utf-8", errors="surrogateescape"))
            pos += n
        self.pos = pos
        return out


class GGUFFile:
    """An open GGUF file: `.version`, `.metadata` (key -> Python value), `.tensors` (name ->
    GGUFTensorInfo, in file order), `.alignment`, `.data_offset`, and `tensor_bytes(name)`."""

    def __init__(self, path):
        self.path = os.fspath(path)
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    raise GGUFError(f"{self.path}: empty file, not a GGUF")
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as exc:
            raise GGUFError(f"{self.path}: cannot read: {exc}") from exc
        # A read-only uint8 view of the whole file; tensor views are slices of it.
        self._bytes = np.frombuffer(self._map, dtype=np.uint8)
        self.metadata = {}
        self.value_types = {}  # key -> its GGUF value type (ARRAY for arrays)
        self.tensors = {}
        self._parse()

    def _parse(self):
        cur = _Cursor(self._map, self.path)
        magic = bytes(self._map[:4])
        if magic != GGUF_MAGIC:
            if len(magic) < 4:
                raise cur.error("truncated file: too short for a GGUF header")
            raise cur.error(f"not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
        cur.take(4)
        self.version = cur.u32()
        if self.version not in SUPPORTED_VERSIONS:
            if self.version & 0xFFFF == 0 and (self.version >> 16) in SUPPORTED_VERSIONS:
                raise cur.error("big-endian GGUF files are not supported")
            raise cur.error(f"unsupported GGUF version {self.version} (supported: 2, 3)")
        n_tensors = cur.u64()
        n_kv = cur.u64()
        # Each entry takes at least its key's length, its type and a 1-byte value; each tensor at
        # least a name length, one dimension, a type and an offset.
        cur.need(n_kv, 8 + 4 + 1, "metadata entries")
        cur.need(n_tensors, 8 + 4 + 8 + 4 + 8, "tensor entries")
        for _ in range(n_kv):
            key = cur.string(MAX_NAME_BYTES, "metadata key")
            vtype = cur.u32()
            if key in self.metadata:
                raise cur.error(f"duplicate metadata key {key!r}")
            self.metadata[key] = cur.value(vtype)
            self.value_types[key] = vtype
        self.alignment = self._alignment(cur)
        infos = [self._tensor_info(cur) for _ in range(n_tensors)]
        self.data_offset = -(-cur.pos // self.alignment) * self.alignment
        for name, dtype, shape, rel in infos:
            if name in self.tensors:
                raise cur.error(f"duplicate tensor {name!r}")
            self.tensors[name] = self._locate(cur, name, dtype, shape, rel)
        spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in self.tensors.values() if t.nbytes)
        for (s0, e0, a), (s1, e1, b) in zip(spans, spans[1:]):
            if s1 < e0:
                raise cur.error(f"tensors {a!r} and {b!r} share bytes ([{s0}, {e0}) and [{s1}, {e1}))")

    def _alignment(self, cur):
        align = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if self.value_types.get("general.alignment", UINT32) != UINT32 or align <= 0 or align & (align - 1):
            raise cur.error(f"general.alignment must be a power-of-two u32, got {align!r}")
        return align

    def _tensor_info(self, cur):
        name = cur.string(MAX_NAME_BYTES, "tensor name")
        n_dims = cur.u32()
        if not 1 <= n_dims <= MAX_DIMS:
            raise cur.error(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        shape = tuple(cur.u64() for _ in range(n_dims))
        dtype = cur.u32()
        rel = cur.u64()
        return name, dtype, shape, rel

    def _locate(self, cur, name, dtype, shape, rel):
        """The tensor's info after checking its type, row length, alignment and bounds."""
        if dtype not in GGML_TYPES:
            raise cur.error(f"tensor {name!r} has unknown GGML type {dtype}")
        tname, block, block_bytes = GGML_TYPES[dtype]
        if shape[0] % block:
            raise cur.error(f"tensor {name!r}: row length {shape[0]} is not a multiple of the "
                            f"{tname} block size {block}")
        n = 1
        for d in shape:
            n *= d
        nbytes = n // block * block_bytes
        if rel % self.alignment:
            raise cur.error(f"tensor {name!r}: data offset {rel} is not a multiple of the alignment "
                            f"{self.alignment}")
        start = self.data_offset + rel
        if start + nbytes > cur.size:
            raise cur.error(f"tensor {name!r}: data [{start}, {start + nbytes}) lies beyond the end "
                            f"of the file ({cur.size} bytes); the file is truncated or corrupt")
        return GGUFTensorInfo(name, dtype, shape, start, nbytes)

    def tensor_bytes(self, name) -> np.ndarray:
        """The stored bytes of tensor `name`: a read-only uint8 view into the mapped file."""
        info = self.tensors[name]
        return self._bytes[info.offset:info.offset + info.nbytes]

    def tensor_path(self, name) -> str:
        """The file that holds tensor `name` (this one; a split model has several)."""
        return self.path

    @property
    def paths(self):
        return [self.path]

    def __repr__(self):
        return f"GGUFFile({self.path!r}, v{self.version}, {len(self.metadata)} keys, {len(self.tensors)} tensors)"


# ---------------------------------------------------------------- models split over several files

SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"
_INTEGER_TYPES = (UINT8, INT8, UINT16, INT16, UINT32, INT32, UINT64, INT64)
SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def split_part_paths(path, count: int):
    """The paths of all `count` parts of the split model whose first part is `path`, by llama.cpp's
    naming (`NAME-%05d-of-%05d.gguf`, numbered from 1). The name is taken as given, not with
    symlinks resolved: in a HuggingFace cache the parts are links to blobs named by hash."""
    path = os.fspath(path)
    folder, base = os.path.split(path)
    m = SPLIT_NAME.match(base)
    if m is None or int(m["no"]) != 1 or int(m["count"]) != count:
        raise GGUFError(f"{path}: the first of {count} split parts must be named "
                        f"NAME-00001-of-{count:05d}.gguf so that the others can be found")
    return [os.path.join(folder, f"{m['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def _split_header(gf: GGUFFile):
    """(split.no, split.count) of one file, or None for a file that is not part of a split."""
    if SPLIT_COUNT not in gf.metadata and SPLIT_NO not in gf.metadata:
        return None
    # llama.cpp writes u16, u16, i32; any integer type is read the same.
    for key in (SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS):
        if key not in gf.metadata:
            raise GGUFError(f"{gf.path}: split GGUF without the {key!r} key")
        if gf.value_types[key] not in _INTEGER_TYPES:
            raise GGUFError(f"{gf.path}: {key!r} must be an integer")
    no, count = int(gf.metadata[SPLIT_NO]), int(gf.metadata[SPLIT_COUNT])
    if not 0 <= no < count:
        raise GGUFError(f"{gf.path}: split.no {no} is outside 0..{count - 1}")
    return no, count


class GGUFSplit:
    """A model split over several GGUF files, seen as one: the first part's `.metadata` and
    `.value_types`, every part's tensors in one `.tensors` table, `tensor_bytes(name)` a view into
    the part that holds it. `.path` is the first part, `.parts` the open files."""

    def __init__(self, parts):
        self.parts = parts
        first = parts[0]
        self.path, self.version = first.path, first.version
        self.metadata, self.value_types = first.metadata, first.value_types
        self.tensors, self._owner = {}, {}
        expected = int(first.metadata[SPLIT_TENSORS])
        for i, part in enumerate(parts):
            header = _split_header(part)
            if header != (i, len(parts)):
                raise GGUFError(f"{part.path}: expected split part {i + 1} of {len(parts)}, the header says "
                                + (f"part {header[0] + 1} of {header[1]}" if header else "it is not a split part"))
            if int(part.metadata[SPLIT_TENSORS]) != expected:
                raise GGUFError(f"{part.path}: split.tensors.count {part.metadata[SPLIT_TENSORS]} differs "
                                f"from the first part's {expected}")
            for name, info in part.tensors.items():
                if name in self.tensors:
                    raise GGUFError(f"{part.path}: tensor {name!r} is also in {self._owner[name].path}")
                self.tensors[name] = info
                self._owner[name] = part
        if len(self.tensors) != expected:
            raise GGUFError(f"{self.path}: the {len(parts)} split parts hold {len(self.tensors)} tensors, "
                            f"the header says {expected}")

    def tensor_bytes(self, name) -> np.ndarray:
        return self._owner[name].tensor_bytes(name)

    def tensor_path(self, name) -> str:
        return self._owner[name].path

    @property
    def paths(self):
        return [p.path for p in self.parts]

    def __repr__(self):
        return f"GGUFSplit({self.path!r}, {len(self.parts)} parts, {len(self.tensors)} tensors)"


def open_gguf(path):
    """A GGUFFile, or a GGUFSplit when `path` is the first part of a split model."""
    first = GGUFFile(path)
    header = _split_header(first)
    if header is None or header == (0, 1):
        return first
    no, count = header
    if no != 0:
        m = SPLIT_NAME.match(os.path.basename(first.path))
        hint = f": open {m['prefix']}-00001-of-{count:05d}.gguf" if m else ""
        raise GGUFError(f"{first.path}: part {no + 1} of a model split over {count} files; "
                        f"load the first part{hint}")
    paths = split_part_paths(first.path, count)
    parts = [first]
    for i, p in enumerate(paths[1:], start=2):
        if not os.path.isfile(p):
            raise GGUFError(f"{first.path}: split part {i} of {count} is missing (expected {p})")
        parts.append(GGUFFile(p))
    return GGUFSplit(parts)


# ---------------------------------------------------------------- GGUF -> HF names and config

ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen2moe": "Qwen2MoeForCausalLM",
                 "qwen3moe": "Qwen3MoeForCausalLM"}

_TOP_LEVEL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

# blk.N.<gguf> -> model.layers.N.<hf>; weight and bias alike.
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    # MoE: the router, and each expert MLP's matrices stacked [experts, rows, cols]
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    # Qwen2-MoE's shared expert and its gate
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
}


def hf_tensor_name(name: str) -> str:
    """The HF name of a GGUF tensor name; names with no HF counterpart are returned unchanged.

    No weight is permuted: llama.cpp stores qwen2/qwen3 q/k projections in HF order (these models
    use the rotate-half RoPE, which its converter leaves alone), unlike its llama conversion."""
    if name in _TOP_LEVEL_NAMES:
        return _TOP_LEVEL_NAMES[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _BLOCK_NAMES \
            and parts[3] in ("weight", "bias"):
        return f"model.layers.{parts[1]}.{_BLOCK_NAMES[parts[2]]}.{parts[3]}"
    return name


def _float_value(gf, key, default=None):
    """A float metadata value; a float32 one as the shortest decimal that rounds to it (1e-06,
    not 9.99999997e-07), as a config file would state it."""
    x = gf.metadata.get(key, default)
    if gf.value_types.get(key) == FLOAT32:
        return float(str(np.float32(x)))
    return float(x)


_INT_TYPES = (UINT8, INT8, UINT16, INT16, UINT32, INT32, UINT64, INT64)
_FLOAT_TYPES = (FLOAT32, FLOAT64)


class _Metadata:
    """Typed reads of a GGUF's metadata: a key of the wrong value type or out of range is a
    GGUFError naming the file and the key."""

    def __init__(self, gf: GGUFFile):
        self.gf, self.md = gf, gf.metadata

    def error(self, msg):
        return GGUFError(f"{self.gf.path}: {msg}")

    def int(self, key, default=None, lo=0, hi=1 << 31):
        if key not in self.md:
            if default is None:
                raise self.error(f"metadata key {key!r} is missing")
            return default
        v, vtype = self.md[key], self.gf.value_types.get(key)
        if vtype not in _INT_TYPES or not lo <= v <= hi:
            raise self.error(f"metadata key {key!r} must be an integer in [{lo}, {hi}], got {v!r}"[:300])
        return int(v)

    def float(self, key, default=None):
        if key not in self.md:
            if default is None:
                raise self.error(f"metadata key {key!r} is missing")
            return default
        v, vtype = self.md[key], self.gf.value_types.get(key)
        if vtype not in _INT_TYPES + _FLOAT_TYPES:
            raise self.error(f"metadata key {key!r} must be a number, got {v!r}"[:300])
        return _float_value(self.gf, key)

    def str(self, key):
        v = self.md.get(key)
        if v is not None and self.gf.value_types.get(key) != STRING:
            raise self.error(f"metadata key {key!r} must be a string, got {v!r}"[:300])
        return v


def gguf_to_hf(gf: GGUFFile):
    """(config, tensors): an HF-style config dict and the tensors under HF names and shapes.

    Tensor data stays in the file's storage type; `Tensor.data` is the zero-copy byte view."""
    m = _Metadata(gf)
    arch = m.str("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFError(f"{gf.path}: architecture {arch!r} is not supported "
                        f"(supported: {', '.join(ARCHITECTURES)})"[:300])
    embd = gf.tensors.get("token_embd.weight")
    if embd is None:
        raise GGUFError(f"{gf.path}: tensor 'token_embd.weight' is missing")
    if len(embd.shape) != 2:
        raise GGUFError(f"{gf.path}: tensor 'token_embd.weight' has shape {list(embd.shape)}, "
                        "not [hidden, vocab]")
    hidden = m.int(f"{arch}.embedding_length", lo=1)
    heads = m.int(f"{arch}.attention.head_count", lo=1)
    expert_ffn = m.int(f"{arch}.expert_feed_forward_length", 0, lo=0)
    config = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": m.int(f"{arch}.block_count", lo=1),
        "num_attention_heads": heads,
        "num_key_value_heads": m.int(f"{arch}.attention.head_count_kv", heads, lo=1),
        # a MoE file may state only its experts' width
        "intermediate_size": m.int(f"{arch}.feed_forward_length", expert_ffn or None, lo=1),
        "rms_norm_eps": m.float(f"{arch}.attention.layer_norm_rms_epsilon"),
        "rope_theta": m.float(f"{arch}.rope.freq_base", 10000.0),
        "max_position_embeddings": m.int(f"{arch}.context_length", lo=1),
        "vocab_size": int(embd.shape[1]),
        "head_dim": m.int(f"{arch}.attention.key_length", max(hidden // heads, 1), lo=1),
        "tie_word_embeddings": "output.weight" not in gf.tensors,
        "attention_bias": "blk.0.attn_q.bias" in gf.tensors,
        "torch_dtype": "float32",
    }
    if arch in ("qwen2moe", "qwen3moe"):
        # llama.cpp's: experts in every layer that has a router; qwen3moe renormalises the picked
        # experts' weights (unless the file says otherwise), qwen2moe does not
        n_layers = config["num_hidden_layers"]
        config.update({
            "num_experts": m.int(f"{arch}.expert_count", lo=1),
            "num_experts_per_tok": m.int(f"{arch}.expert_used_count", lo=1),
            "moe_intermediate_size": m.int(f"{arch}.expert_feed_forward_length", lo=1),  # required here
            "norm_topk_prob": bool(gf.metadata.get(f"{arch}.expert_weights_norm", arch == "qwen3moe")),
            "mlp_only_layers": [i for i in range(min(n_layers, 1 << 16))
                                if f"blk.{i}.ffn_gate_inp.weight" not in gf.tensors],
        })
        if arch == "qwen2moe":
            config["shared_expert_intermediate_size"] = m.int(f"{arch}.expert_shared_feed_forward_length", lo=1)
            config["qkv_bias"] = config["attention_bias"]
    # RoPE scaling in transformers' terms; the loader refuses what it cannot run.
    scaling = gf.metadata.get(f"{arch}.rope.scaling.type")
    if scaling is not None and scaling != "none":
        rope = {"rope_type": str(scaling)[:100], "type": str(scaling)[:100]}
        key = f"{arch}.rope.scaling."
        for name, hf in (("factor", "factor"), ("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            if key + name in gf.metadata:
                rope[hf] = m.float(key + name)
        if key + "original_context_length" in gf.metadata:
            rope["original_max_position_embeddings"] = m.int(key + "original_context_length")
        # llama.cpp's own YaRN knobs, whose meaning differs from transformers' attention_factor:
        # read only at the values that change nothing
        for name, neutral in (("attn_factor", (1.0,)), ("yarn_attn_factor", (1.0,)),
                              ("yarn_ext_factor", (-1.0, 1.0)), ("yarn_log_multiplier", (0.0,))):
            if key + name in gf.metadata and gf.metadata[key + name] not in neutral:
                raise GGUFError(f"{gf.path}: {key + name} = {gf.metadata[key + name]!r} is not supported"[:300])
        config["rope_scaling"] = rope
    for key in ("eos_token_id", "bos_token_id"):
        if f"tokenizer.ggml.{key}" in gf.metadata:
            config[key] = m.int(f"tokenizer.ggml.{key}")

    tensors, gguf_names = {}, {}
    for name, info in gf.tensors.items():
        hf = hf_tensor_name(name)
        if hf in tensors:  # two GGUF names for one HF tensor (e.g. "output.weight" and "lm_head.weight")
            raise GGUFError(f"{gf.path}: tensors {gguf_names[hf]!r} and {name!r} both stand for {hf!r}"[:300])
        gguf_names[hf] = name
        shape = tuple(reversed(info.shape))
        if hf.endswith("mlp.shared_expert_gate.weight") and len(shape) == 1:
            shape = (1,) + shape  # llama.cpp keeps this [1, hidden] matrix as a vector
        tensors[hf] = Tensor(name=hf, dtype=info.dtype, shape=shape, data=gf.tensor_bytes(name),
                             source=gf.tensor_path(name))
    return config, tensors
