"""Mutation fuzzing of everything qwenc reads from a model: the harness both drivers share.

Seeds are real files: a small Qwen2.5 GGUF made from the demo GGUF's own header (its metadata
keys and values, its chat template, the first tokens and merges of its vocabulary, the added
tokens; layer sizes scaled down, tiny tensors of the kinds the demo holds), the demo GGUF's
header bytes themselves, and a HuggingFace model directory written by transformers
(tests/modelgen.py) with a tokenizer.json saved by HF `tokenizers`.

Each case mutates one file of a seed, structurally (a GGUF metadata value or type, a tensor's
dimensions, type or offset, a JSON value anywhere in a file, a chat template spliced with
hostile snippets) and then, sometimes, byte by byte; then runs what a user runs: qwenc.load,
a forward pass, a few sampled tokens, encode/decode, rendering the chat template. The contract:
load either succeeds or raises a ModelFormatError naming the file; everything after a successful
load works (a chat template may raise ChatTemplateError). Anything else is a finding.

Drivers: tests/test_fuzz.py (hypothesis, a bounded run in the suite) and tests/fuzz_atheris.py
(coverage-guided, `make fuzz`). Both hand the harness a `Source` of choices.
"""
import json
import math
import os
import shutil
import struct
import sys
from pathlib import Path

import numpy as np

import qwenc
from qwenc.errors import ChatTemplateError, ModelFormatError
from qwenc.formats import gguf as G

TEXT = "Hello, world! def f(x):\n    return x ** 2  # 你好 🙂\n\n"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "What is 2+2?"}]


# ---------------------------------------------------------------- sources of choices

class Source:
    """Where a case's choices come from. below(n): an int in [0, n)."""

    def below(self, n: int) -> int:
        raise NotImplementedError

    def chance(self, num: int, den: int) -> bool:
        return self.below(den) < num

    def pick(self, seq):
        return seq[self.below(len(seq))]

    def blob(self, max_len: int) -> bytes:
        return bytes(self.below(256) for _ in range(self.below(max_len + 1)))


class RandomSource(Source):
    def __init__(self, rng):
        self.rng = rng

    def below(self, n):
        return self.rng.randrange(n) if n > 1 else 0


class HypothesisSource(Source):
    def __init__(self, data):
        from hypothesis import strategies as st
        self.data, self.st = data, st

    def below(self, n):
        return self.data.draw(self.st.integers(0, n - 1)) if n > 1 else 0

    def blob(self, max_len):
        return self.data.draw(self.st.binary(max_size=max_len))


class AtherisSource(Source):
    def __init__(self, fdp):
        self.fdp = fdp

    def below(self, n):
        return self.fdp.ConsumeIntInRange(0, n - 1) if n > 1 else 0

    def blob(self, max_len):
        return self.fdp.ConsumeBytes(self.below(max_len + 1))


# ---------------------------------------------------------------- interesting values

INTS = [0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 96, 127, 128, 255, 256, 257, 1000, 1023,
        1024, 4095, 4096, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53, 2**62, 2**63 - 1, 2**63,
        2**64 - 1, -1, -2, -128, -2**31, -2**63]
FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-6, 1e-30, 1e-45, 1e6, 1e30, 3.4e38, 1e308, float("inf"),
          float("-inf"), float("nan")]
STRINGS = ["", "x", "qwen2", "qwen3", "llama", "gpt2", "default", "yarn", "none", "F32", "BF16", "I64",
           "\x00", "\n", "a b", "<|im_end|>", "Ġ", "é", "\ud800", "A" * 5000]
# Jinja snippets spliced into chat templates: loops that never end, recursion, huge values,
# sandbox escapes, errors, syntax errors.
TEMPLATE_SNIPPETS = [
    "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
    "{% macro m(x) %}{{ m(x) }}{% endmacro %}{{ m(1) }}",
    "{{ 'ab' * 999999999 }}", "{{ [1] * 999999999 }}", "{{ 'a'|center(999999999) }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "{{ '{:>999999999}'.format(1) }}", "{{ '%0999999999d' % 1 }}", "{{ 9 ** 9999999 }}",
    "{{ ('x' * 1000)|indent(999999) }}", "{{ messages|tojson(indent=999999) }}",
    "{{ raise_exception('no') }}", "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.append(1) }}", "{% for %}", "{{ 1 / 0 }}", "{{ undefined_name.x.y }}",
    "{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}", "{{ 'x'.replace('', 'y' * 9999) }}",
    "{{ (((((((((((((((((((((((((((((((1))))))))))))))))))))))))))))))) }}" * 3,
    "{{ strftime_now('%Y' * 99999) }}", "{{ range(99999)|join(',' * 9999) }}",
    "{% set x = dict(a=1) %}{{ x.update(b=2) }}", "{{ namespace(_x=1) }}", "{{ lipsum(999999) }}",
]


def _wrap_int(v, vtype):
    bits = {G.UINT8: 8, G.INT8: 8, G.UINT16: 16, G.INT16: 16, G.UINT32: 32, G.INT32: 32, G.UINT64: 64,
            G.INT64: 64}[vtype]
    v &= (1 << bits) - 1
    if vtype in (G.INT8, G.INT16, G.INT32, G.INT64) and v >= 1 << (bits - 1):
        v -= 1 << bits
    return v


def mutate_bytes(src: Source, raw: bytes, hot=None) -> bytes:
    """A few byte-level edits; `hot` is (start, end) of the region most edits go to."""
    buf = bytearray(raw)
    for _ in range(1 + src.below(4)):
        if not buf:
            buf = bytearray(src.blob(16))
            continue
        if hot and src.chance(3, 4):
            lo, hi = hot
            pos = lo + src.below(max(1, min(hi, len(buf)) - lo))
        else:
            pos = src.below(len(buf))
        pos = min(pos, len(buf) - 1)
        op = src.below(7)
        if op == 0:
            buf[pos] = src.below(256)
        elif op == 1:
            buf[pos] ^= 1 << src.below(8)
        elif op == 2:  # an interesting little-endian integer
            width = src.pick([1, 2, 4, 8])
            v = src.pick(INTS) & ((1 << (8 * width)) - 1)
            buf[pos:pos + width] = v.to_bytes(width, "little")
        elif op == 3:
            del buf[pos:pos + 1 + src.below(64)]
        elif op == 4:
            buf[pos:pos] = src.blob(32)
        elif op == 5:  # duplicate a range
            n = 1 + src.below(64)
            buf[pos:pos] = buf[pos:pos + n]
        else:
            del buf[pos:]
    return bytes(buf)


def mutate_string(src: Source, s: str) -> str:
    op = src.below(6)
    if op == 0:
        return src.pick(STRINGS)
    if op == 1:
        return s[:src.below(len(s) + 1)]
    if op == 2:
        i = src.below(len(s) + 1)
        return s[:i] + src.pick(STRINGS + ["{{", "}}", "{%", "%}", "\n", " "]) + s[i:]
    if op == 3:
        return s * (1 + src.below(3))
    if op == 4:
        return src.blob(24).decode("utf-8", "surrogateescape")
    return s + src.pick(STRINGS)


def mutate_template(src: Source, t: str) -> str:
    if src.chance(2, 3):
        i = src.below(len(t) + 1)
        if src.chance(1, 2):  # at a tag boundary, where a snippet keeps the template parseable
            cut = [j for j in range(len(t)) if t.startswith("{%", j) or t.startswith("{{", j)]
            i = src.pick(cut) if cut else i
        return t[:i] + src.pick(TEMPLATE_SNIPPETS) + t[i:]
    return mutate_string(src, t)


# ---------------------------------------------------------------- JSON values

def random_json(src: Source, depth=0):
    kind = src.below(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return src.chance(1, 2)
    if kind == 2:
        return src.pick(INTS + [10**30, -10**30])
    if kind == 3:
        return src.pick(FLOATS)
    if kind in (4, 5):
        return src.pick(STRINGS)
    if kind == 6:
        return [random_json(src, depth + 1) for _ in range(src.below(4))]
    if kind == 7:
        return {src.pick(STRINGS): random_json(src, depth + 1) for _ in range(src.below(4))}
    return [[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]


def mutate_json(src: Source, value, template_keys=("chat_template",)):
    """One structural edit somewhere in a parsed JSON document (a random walk from the root)."""
    if not isinstance(value, (dict, list)) or not value:
        return random_json(src)
    path, node = [], value
    while isinstance(node, (dict, list)) and node and (not path or src.chance(3, 4)):
        key = src.pick(list(node)) if isinstance(node, dict) else src.below(len(node))
        path.append((node, key))
        node = node[key]
    parent, key = path[-1]
    op = src.below(8)
    if op == 0 and isinstance(parent, dict):
        del parent[key]
    elif op == 0:
        del parent[key]
    elif op == 1:
        parent[key] = random_json(src)
    elif op == 2 and isinstance(node, bool):
        parent[key] = not node
    elif op == 2 and isinstance(node, (int, float)):
        parent[key] = src.pick([node + 1, node - 1, -node, node * 2, node * 1000, 0, node + 0.5])
    elif op == 2 and isinstance(node, str):
        parent[key] = mutate_template(src, node) if key in template_keys else mutate_string(src, node)
    elif op == 3 and isinstance(parent, list):
        parent.insert(src.below(len(parent) + 1), node)
    elif op == 3:
        parent[src.pick(STRINGS[:12])] = node
    elif op == 4 and isinstance(node, list):
        del node[src.below(len(node) + 1):]
    elif op == 5:
        parent[key] = str(node)[:100]
    elif op == 6 and key in template_keys and isinstance(node, str):
        parent[key] = mutate_template(src, node)
    else:
        parent[key] = src.pick(INTS)
    return value


def dump_json(src: Source, value) -> bytes:
    text = json.dumps(value, ensure_ascii=src.chance(1, 2), allow_nan=True)
    raw = text.encode("utf-8", "surrogatepass")
    if src.chance(1, 8):
        raw = mutate_bytes(src, raw)
    return raw


# ---------------------------------------------------------------- GGUF, written by hand

def _value_bytes(vtype, value) -> bytes:
    if vtype in G._SCALAR:
        fmt = G._SCALAR[vtype][0]
        if vtype == G.FLOAT32:
            return np.float32(value).tobytes() if abs(value) <= 3.4e38 or value != value else \
                np.float32(math.copysign(math.inf, value)).tobytes()
        if vtype == G.FLOAT64:
            return struct.pack(fmt, float(value))
        if vtype == G.BOOL:
            return struct.pack("<B", int(value) & 0xFF)
        return struct.pack(fmt, _wrap_int(int(value), vtype))
    if vtype == G.STRING:
        b = value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")
        return struct.pack("<Q", len(b)) + b
    etype, items = value
    out = [struct.pack("<IQ", etype, len(items))]
    out.extend(_value_bytes(etype, v) for v in items)
    return b"".join(out)


def write_gguf(parts) -> bytes:
    """parts: dict(version, kvs=[(key, vtype, value)], tensors=[(name, dims, ggml_type, offset)],
    data=bytes, alignment). An ARRAY value is (element type, items)."""
    head = [b"GGUF", struct.pack("<IQQ", parts["version"], len(parts["tensors"]), len(parts["kvs"]))]
    for key, vtype, value in parts["kvs"]:
        head += [_value_bytes(G.STRING, key), struct.pack("<I", vtype), _value_bytes(vtype, value)]
    for name, dims, ttype, offset in parts["tensors"]:
        head += [_value_bytes(G.STRING, name), struct.pack("<I", len(dims)),
                 struct.pack(f"<{len(dims)}Q", *(d & (2**64 - 1) for d in dims)),
                 struct.pack("<IQ", ttype & 0xFFFFFFFF, offset & (2**64 - 1))]
    raw = b"".join(head)
    align = parts.get("alignment", G.DEFAULT_ALIGNMENT)
    align = align if isinstance(align, int) and align > 0 else 32
    return raw + b"\0" * (-len(raw) % align) + parts["data"]


MINI = dict(hidden=64, heads=4, kv_heads=2, ffn=256, layers=2, kept_tokens=400)


def mini_gguf_parts(demo_path) -> dict:
    """A small Qwen2.5 GGUF from the demo's header: same keys, values and template; the first
    kept_tokens tokens, the merges among them and the added tokens; scaled-down tensors."""
    gf = G.open_gguf(demo_path)
    md, types = gf.metadata, gf.value_types
    toks, ttypes = md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"]
    keep = list(range(MINI["kept_tokens"])) + [i for i, t in enumerate(ttypes) if t in (3, 4)]
    remap = {old: new for new, old in enumerate(keep)}
    tokens = [toks[i] for i in keep]
    kept = set(tokens)
    merges = [m for m in md["tokenizer.ggml.merges"]
              if (lambda a, b: a in kept and b in kept and a + b in kept)(*m.split(" ", 1))]
    vocab = len(tokens)
    h, ffn, q, kv = MINI["hidden"], MINI["ffn"], MINI["hidden"], MINI["kv_heads"] * (MINI["hidden"] // MINI["heads"])
    sizes = {"qwen2.block_count": MINI["layers"], "qwen2.embedding_length": h, "qwen2.feed_forward_length": ffn,
             "qwen2.attention.head_count": MINI["heads"], "qwen2.attention.head_count_kv": MINI["kv_heads"],
             "qwen2.context_length": 4096}
    kvs = []
    for key, value in md.items():
        vt = types[key]
        if key == "tokenizer.ggml.tokens":
            kvs.append((key, G.ARRAY, (G.STRING, tokens)))
        elif key == "tokenizer.ggml.token_type":
            kvs.append((key, G.ARRAY, (G.INT32, [ttypes[i] for i in keep])))
        elif key == "tokenizer.ggml.merges":
            kvs.append((key, G.ARRAY, (G.STRING, merges)))
        elif key.endswith("_token_id"):
            kvs.append((key, vt, remap.get(value, 0)))
        elif key in sizes:
            kvs.append((key, vt, sizes[key]))
        elif vt == G.ARRAY:
            continue  # (the demo has no other arrays)
        else:
            kvs.append((key, vt, value))
    rng = np.random.default_rng(0)
    tensors, data = [], bytearray()

    def add(name, shape_hf, ttype):
        rows, cols = (shape_hf if len(shape_hf) == 2 else (1, shape_hf[0]))
        if ttype == 0:
            raw = (rng.standard_normal(rows * cols) * 0.1).astype(np.float32).tobytes()
        elif ttype == 1:
            raw = (rng.standard_normal(rows * cols) * 0.1).astype(np.float16).tobytes()
        else:  # block-quantized: blocks with sane f16 scales and random codes
            _, elems, nbytes = G.GGML_TYPES[ttype]
            blocks = rng.integers(0, 256, (rows * cols // elems, nbytes), dtype=np.uint8)
            blocks[:, :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
            raw = blocks.tobytes()
        data.extend(b"\0" * (-len(data) % 32))
        tensors.append((name, tuple(reversed(shape_hf)), ttype, len(data)))
        data.extend(raw)

    add("token_embd.weight", (vocab, h), 1)
    add("output_norm.weight", (h,), 0)
    for i in range(MINI["layers"]):
        add(f"blk.{i}.attn_norm.weight", (h,), 0)
        add(f"blk.{i}.attn_q.weight", (q, h), 8)        # Q8_0
        add(f"blk.{i}.attn_q.bias", (q,), 0)
        add(f"blk.{i}.attn_k.weight", (kv, h), 2)       # Q4_0
        add(f"blk.{i}.attn_k.bias", (kv,), 0)
        add(f"blk.{i}.attn_v.weight", (kv, h), 1)
        add(f"blk.{i}.attn_v.bias", (kv,), 0)
        add(f"blk.{i}.attn_output.weight", (h, q), 0)
        add(f"blk.{i}.ffn_norm.weight", (h,), 0)
        add(f"blk.{i}.ffn_gate.weight", (ffn, h), 6)    # Q5_0
        add(f"blk.{i}.ffn_up.weight", (ffn, h), 8)
        add(f"blk.{i}.ffn_down.weight", (h, ffn), 14)   # Q6_K (rows of 256)
    data.extend(b"\0" * (-len(data) % 32))
    return {"version": 3, "kvs": kvs, "tensors": tensors, "data": bytes(data), "alignment": 32}


_EXTRA_KEYS = [("general.alignment", G.UINT32), ("qwen2.attention.key_length", G.UINT32),
               ("qwen2.rope.scaling.type", G.STRING), ("tokenizer.chat_templates", G.ARRAY),
               ("tokenizer.chat_template.tool_use", G.STRING), ("tokenizer.ggml.unknown_token_id", G.UINT32),
               ("tokenizer.ggml.add_bos_token", G.BOOL), ("general.architecture", G.UINT32)]


def _random_value(src: Source, vtype):
    if vtype in (G.FLOAT32, G.FLOAT64):
        return src.pick(FLOATS)
    if vtype == G.BOOL:
        return src.below(256)
    if vtype in G._SCALAR:
        return src.pick(INTS)
    if vtype == G.STRING:
        return src.pick(STRINGS)
    etype = src.pick([G.STRING, G.INT32, G.UINT8, G.FLOAT32, G.ARRAY])
    if etype == G.ARRAY:
        return (G.ARRAY, [(G.INT32, [1, 2])] * src.below(3))
    return (etype, [_random_value(src, etype) for _ in range(src.below(5))])


def mutate_gguf(src: Source, seed: dict) -> bytes:
    parts = {"version": seed["version"], "kvs": list(seed["kvs"]), "tensors": list(seed["tensors"]),
             "data": seed["data"], "alignment": seed["alignment"]}
    kvs, tensors = parts["kvs"], parts["tensors"]
    for _ in range(1 + src.below(3)):
        op = src.below(12)
        if op <= 3 and kvs:  # a value, keeping its type
            i = src.below(len(kvs))
            key, vt, value = kvs[i]
            if vt == G.STRING:
                value = mutate_template(src, value) if "chat_template" in key else mutate_string(src, value)
            elif vt == G.ARRAY:
                etype, items = value
                items = list(items)
                sub = src.below(5)
                if sub == 0:
                    del items[src.below(len(items) + 1):]
                elif sub == 1 and items:
                    j = src.below(len(items))
                    items[j] = mutate_string(src, items[j]) if etype == G.STRING else _random_value(src, etype)
                elif sub == 2 and items:
                    items.insert(src.below(len(items)), items[src.below(len(items))])
                elif sub == 3:
                    etype = src.pick([G.STRING, G.INT32, G.UINT64, G.FLOAT32, G.BOOL, G.UINT8])
                    items = [_random_value(src, etype) for _ in range(src.below(6))]
                else:
                    items = items[::-1]
                value = (etype, items)
            else:
                value = _random_value(src, vt)
            kvs[i] = (key, vt, value)
        elif op == 4 and kvs:  # a value of another type
            i = src.below(len(kvs))
            vt = src.pick([G.UINT8, G.INT32, G.UINT32, G.UINT64, G.INT64, G.FLOAT32, G.FLOAT64, G.BOOL,
                           G.STRING, G.ARRAY])
            kvs[i] = (kvs[i][0], vt, _random_value(src, vt))
        elif op == 5 and kvs:
            del kvs[src.below(len(kvs))]
        elif op == 6:
            key, vt = src.pick(_EXTRA_KEYS)
            kvs.insert(src.below(len(kvs) + 1), (key, vt, _random_value(src, vt)))
        elif op == 7 and kvs:
            kvs.insert(src.below(len(kvs) + 1), kvs[src.below(len(kvs))])
        elif op == 8 and tensors:  # dimensions
            i = src.below(len(tensors))
            name, dims, tt, off = tensors[i]
            dims = list(dims)
            if dims and src.chance(3, 4):
                dims[src.below(len(dims))] = src.pick(INTS[:30] + [dims[0] * 2, dims[0] // 2, 2**40])
            else:
                dims = [src.pick(INTS[:20]) for _ in range(src.below(6))]
            tensors[i] = (name, tuple(d & (2**64 - 1) for d in dims), tt, off)
        elif op == 9 and tensors:  # type
            i = src.below(len(tensors))
            name, dims, tt, off = tensors[i]
            tensors[i] = (name, dims, src.pick(list(G.GGML_TYPES) + [9, 31, 99, 2**31]), off)
        elif op == 10 and tensors:  # offset, name, presence
            i = src.below(len(tensors))
            name, dims, tt, off = tensors[i]
            sub = src.below(4)
            if sub == 0:
                tensors[i] = (name, dims, tt, src.pick([0, 32, off + 32, off - 32, len(parts["data"]), 2**63]))
            elif sub == 1:
                tensors[i] = (src.pick([t[0] for t in tensors] + ["output.weight", "x"]), dims, tt, off)
            else:
                del tensors[i]
        else:
            parts["version"] = src.pick([1, 2, 3, 4, 3 << 16, 2**32 - 1]) if src.chance(1, 3) else parts["version"]
    raw = write_gguf(parts)
    if src.chance(1, 3):
        header_end = len(raw) - len(parts["data"])
        raw = mutate_bytes(src, raw, hot=(0, header_end))
    return raw


# ---------------------------------------------------------------- running one case

class Finding(AssertionError):
    """The harness's contract broken (what the drivers report)."""


def exercise(path, named: str):
    """Load `path` and use the model as a user would. Returns "refused" or "loaded"; raises
    Finding (or lets the unexpected exception through) when the contract is broken."""
    try:
        model = qwenc.load(path, context=16, threads=1)
    except ModelFormatError as exc:
        if named not in str(exc):
            raise Finding(f"{type(exc).__name__} does not name {named!r}: {exc}") from exc
        return "refused"
    vocab = model.config.vocab_size
    ids = [0, min(1, vocab - 1), vocab - 1]
    logits = model.logits(ids)
    if logits.shape != (vocab,):
        raise Finding(f"logits of shape {logits.shape} for a vocabulary of {vocab}")
    drawn = list(model.generate_tokens(ids, max_tokens=2, temperature=1.0, top_p=0.9, top_k=5, min_p=0.01,
                                       repetition_penalty=1.1, seed=0, stop_token_ids=[]))
    if not all(0 <= t < vocab for t in drawn):
        raise Finding(f"sampled ids {drawn} outside the vocabulary of {vocab}")
    tok = model.tokenizer
    if tok is not None:
        enc = tok.encode(TEXT)
        if not all(0 <= t < vocab for t in enc):
            raise Finding("the tokenizer produced an id without an embedding row")
        tok.decode(enc)
        tok.decode(enc, skip_special_tokens=True)
        if model.chat_template is not None:
            try:
                prompt = model.chat_template.render(MESSAGES, add_generation_prompt=True)
            except ChatTemplateError:
                pass
            else:
                tok.encode(prompt)
    return "loaded"


class Workspace:
    """The seeds, built once, and a scratch directory the cases are written to."""

    def __init__(self, root, demo_gguf):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.demo_gguf = str(demo_gguf)
        self.mini = mini_gguf_parts(self.demo_gguf)
        gf = G.open_gguf(self.demo_gguf)
        with open(self.demo_gguf, "rb") as f:
            self.demo_header = f.read(gf.data_offset)
        self.demo_size = os.path.getsize(self.demo_gguf)
        self.hf_dir = self.root / "seed-hf"
        if not (self.hf_dir / "config.json").exists():
            build_hf_seed(self.hf_dir, self.mini)
        self.hf_files = {p.name: p.read_bytes() for p in sorted(self.hf_dir.iterdir())}
        self.case = self.root / "case"

    # one case of each kind; each returns the outcome of exercise()

    def gguf_case(self, src: Source):
        path = self.root / "case.gguf"
        path.write_bytes(mutate_gguf(src, self.mini))
        return exercise(path, path.name)

    def demo_header_case(self, src: Source):
        """The real demo header, mutated where its structure is (the counts and small keys at
        the start, the tensor table at the end), over a sparse data section of the real size."""
        raw = self.demo_header
        n = len(raw)
        hot = (0, 4096) if src.chance(1, 2) else (n - 20000, n)
        path = self.root / "demo-case.gguf"
        with open(path, "wb") as f:
            f.write(mutate_bytes(src, raw, hot=hot))
            f.truncate(self.demo_size)
        try:
            gf = G.open_gguf(path)
            config, tensors = G.gguf_to_hf(gf)
            qwenc.formats.config.config_from_dict(config, str(path))
        except ModelFormatError as exc:
            if path.name not in str(exc):
                raise Finding(f"{type(exc).__name__} does not name {path.name!r}: {exc}") from exc
            return "refused"
        return "loaded"

    def hf_case(self, src: Source):
        if self.case.exists():
            shutil.rmtree(self.case)
        shutil.copytree(self.hf_dir, self.case)
        name = src.pick(sorted(self.hf_files))
        raw = self.hf_files[name]
        if name.endswith(".safetensors"):
            raw = mutate_safetensors(src, raw)
        elif name.endswith(".json"):
            try:
                doc = json.loads(raw)
            except ValueError:
                doc = None
            raw = dump_json(src, mutate_json(src, doc)) if doc is not None and src.chance(7, 8) else \
                mutate_bytes(src, raw)
        else:
            raw = mutate_bytes(src, raw)
        if src.chance(1, 16):
            (self.case / name).unlink()
        else:
            (self.case / name).write_bytes(raw)
        # Files disagreeing with each other may be reported by either one: any path of the model
        # directory names the problem's place.
        return exercise(self.case, str(self.case))


def mutate_safetensors(src: Source, raw: bytes) -> bytes:
    (n,) = struct.unpack("<Q", raw[:8])
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    if src.chance(3, 4):
        header = mutate_json(src, header)
        text = json.dumps(header, allow_nan=True).encode("utf-8", "surrogatepass")
        length = len(text) if src.chance(7, 8) else src.pick(INTS) & (2**64 - 1)
        out = struct.pack("<Q", length) + text + data
    else:
        out = raw
    if src.chance(1, 3):
        out = mutate_bytes(src, out, hot=(0, 8 + n))
    return out


def build_hf_seed(out_dir: Path, mini: dict):
    """A transformers-written random model (modelgen) of the mini GGUF's sizes, sharded, with a
    tokenizer.json saved by HF tokenizers from the mini vocabulary, tokenizer_config.json with
    the demo's chat template, and a generation_config.json."""
    from tokenizers import AddedToken
    from modelgen import make_model
    from oracles import qwen2_pipeline
    kv = {k: v for k, _, v in mini["kvs"]}
    tokens, types = kv["tokenizer.ggml.tokens"][1], kv["tokenizer.ggml.token_type"][1]
    vocab = {t: i for i, (t, k) in enumerate(zip(tokens, types)) if k == 1}
    merges = [tuple(m.split(" ", 1)) for m in kv["tokenizer.ggml.merges"][1]]
    tok = qwen2_pipeline(vocab, merges)
    added = [(t, i) for i, (t, k) in enumerate(zip(tokens, types)) if k in (3, 4)]
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t, _ in added])
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    make_model(tmp, arch="qwen2", dtype="bf16", vocab_size=len(tokens), hidden_size=MINI["hidden"],
               intermediate_size=128, num_attention_heads=MINI["heads"], num_key_value_heads=MINI["kv_heads"],
               shard_size="100KB")
    tok.save(str(tmp / "tokenizer.json"))
    (tmp / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
        "chat_template": kv["tokenizer.chat_template"]}))
    (tmp / "generation_config.json").write_text(json.dumps({
        "eos_token_id": [len(vocab) + 2, len(vocab)], "temperature": 0.7, "top_p": 0.8, "top_k": 20,
        "repetition_penalty": 1.05, "do_sample": True}))
    tmp.rename(out_dir)


KINDS = ("gguf", "hf", "demo_header")


def run_case(ws: Workspace, kind: str, src: Source):
    return {"gguf": ws.gguf_case, "hf": ws.hf_case, "demo_header": ws.demo_header_case}[kind](src)


def main():
    """A quick run with Python's own random choices: python tests/fuzzing.py DIR N."""
    import random
    import time
    import traceback
    from qwenc.formats.demo import demo_model_path
    ws = Workspace(sys.argv[1], demo_model_path(progress=None))
    t0 = time.time()
    counts, failures = {}, {}
    for i in range(int(sys.argv[2])):
        kind = KINDS[i % 2]
        try:
            out = run_case(ws, kind, RandomSource(random.Random(i)))
        except Exception as exc:
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            failures.setdefault((type(exc).__name__, tb.filename, tb.lineno), (i, kind, str(exc)[:300]))
            out = "FINDING"
        counts[(kind, out)] = counts.get((kind, out), 0) + 1
    print(counts, f"{time.time() - t0:.1f} s")
    for key, v in failures.items():
        print(key, v)


if __name__ == "__main__":
    main()
