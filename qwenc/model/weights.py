"""A model's weights as the forward pass uses them: matrices in their stored type, vectors in float32.

`Weights` picks the tensors a config needs out of a {name: Tensor} map (from either file format),
checking every shape, and optionally re-encodes the matrices (`dtype=` at load). For the integer
activation modes, `Weights.repack()` adds to each block-quantized matrix its row-interleaved copy
(csrc/intdot.c: the same values, laid out so one unpacked block serves 8 rows and every
activation row of a product) and lets the mapped file's pages of the original go. BF16 matrices
take theirs in every mode (4 rows interleaved 8 values at a time, so that the float row kernel
reads them as one stream).
"""
import mmap
from dataclasses import dataclass

import numpy as np

from .. import _ops
from ..errors import WeightError
from ..formats.config import ModelConfig
from ..formats.tensors import BF16, BLOCK, DTYPE_NAMES, F32, Q8_0, Tensor, row_bytes


def _type_name(dtype: int) -> str:
    from ..formats.gguf import GGML_TYPES
    return DTYPE_NAMES.get(dtype) or (GGML_TYPES[dtype][0] if dtype in GGML_TYPES else f"type {dtype}")


@dataclass
class Linear:
    """y = x @ W.T (+ b): W stays in its stored type; b (if any) is float32. `packed`, when set,
    is W repacked (for the integer path, or BF16's for the float row kernel; the same values, so
    every product gives the same bits on it): the products use it."""
    weight: Tensor
    bias: np.ndarray = None
    packed: Tensor = None

    @property
    def out_features(self):
        return self.weight.shape[0]

    def _matrix(self) -> Tensor:
        return self.packed if self.packed is not None else self.weight

    def __call__(self, x: np.ndarray, out: np.ndarray, act: int = 0):
        w = self._matrix()
        _ops.matmul(w.data, w.dtype, w.shape[0], w.shape[1], x, out, self.bias, act)
        return out

    def product(self, out: np.ndarray):
        """This layer's part of a group product (_ops.matmul_group) writing into out."""
        w = self._matrix()
        return (w.data, w.dtype, w.shape[0], out, self.bias)

    @property
    def integer(self) -> bool:
        """Whether the integer modes' products on W take the integer path: W repacked into an
        integer layout (a BF16 copy stays on the float path)."""
        return self.packed is not None and self.packed.dtype != _ops.r8_of(BF16)

    def repacks(self, integer: bool = True) -> bool:
        """Whether repack() would repack W: a block-quantized W (for the integer path), or a BF16
        one (for the float row kernel, in every mode)."""
        w = self.weight
        return (self.packed is None and _ops.repacks(w.dtype, w.shape[1])
                and (integer or w.dtype == BF16))

    def repack_bytes(self, integer: bool = True) -> int:
        """Bytes repack() would allocate (0: nothing to repack)."""
        w = self.weight
        return _ops.matrix_bytes(_ops.r8_of(w.dtype), *w.shape) if self.repacks(integer) else 0

    def repack(self, arena=None, integer: bool = True) -> bool:
        """Add the row-interleaved copy of W (once) where it has one (repacks()); True when W is
        repacked. `arena`: an Arena to take the copy's memory from (else its own array). An
        in-memory original (re-encoded at load) is dropped: keeping both would hold the weights
        twice, and the copy has the same values in every mode (a tied table's lookup then reads
        the copy: Weights.repack). A file-mapped original stays, its pages let go."""
        if self.repacks(integer):
            w = self.weight
            data, code, mapped = _repack_in_pieces(w, arena)
            self.packed = Tensor(w.name, code, w.shape, data, w.source)
            if not mapped:
                self.weight = self.packed
        return self.packed is not None


@dataclass
class Layer:
    attn_norm: np.ndarray   # [hidden]
    q: Linear               # [heads * head_dim, hidden]
    k: Linear               # [kv_heads * head_dim, hidden]
    v: Linear               # [kv_heads * head_dim, hidden]
    o: Linear               # [hidden, heads * head_dim]
    q_norm: np.ndarray      # [head_dim] (Qwen3) or None
    k_norm: np.ndarray      # [head_dim] (Qwen3) or None
    mlp_norm: np.ndarray    # [hidden]
    gate: Linear            # [intermediate, hidden]; None in a layer of experts
    up: Linear              # [intermediate, hidden]
    down: Linear            # [hidden, intermediate]
    router: Linear = None   # [experts, hidden] (Qwen2-MoE, Qwen3-MoE)
    experts: list = None    # per expert (gate, up, down), each [moe_intermediate, hidden] ...
    shared: tuple = None    # Qwen2-MoE's shared expert (gate, up, down) ...
    shared_gate: Linear = None  # ... and its gate [1, hidden]

    def mlp_linears(self):
        if self.experts is None:
            return (self.gate, self.up, self.down)
        shared = self.shared + (self.shared_gate,) if self.shared else ()
        return (self.router,) + tuple(lin for expert in self.experts for lin in expert) + shared


class Weights:
    """Picks the tensors a config needs out of a {name: Tensor} map, checking every shape."""

    def __init__(self, cfg: ModelConfig, tensors: dict, convert=None):
        self.cfg, self.tensors, self.convert = cfg, tensors, convert or (lambda t: t)
        h, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
        self.embed = self.matrix("model.embed_tokens.weight", (cfg.vocab_size, h))
        self.norm = self.vector("model.norm.weight", h)
        if cfg.tie_word_embeddings:
            # A tied checkpoint may still carry lm_head.weight; the embedding is the truth.
            self.lm_head = self.embed
        else:
            # Untied: the head is a matrix of its own. Falling back to the embedding when it is
            # missing would give a model that talks, but not the one the config describes.
            self.lm_head = self.matrix("lm_head.weight", (cfg.vocab_size, h))
        self.head = Linear(self.lm_head)
        self.layers = []
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            bias = cfg.attention_bias
            mlp = self.moe_mlp(p) if i in cfg.moe_layers else dict(zip(("gate", "up", "down"),
                                                                         self.mlp(p + "mlp.", inter)))
            self.layers.append(Layer(
                attn_norm=self.vector(p + "input_layernorm.weight", h),
                q=Linear(self.matrix(p + "self_attn.q_proj.weight", (q, h)), self.bias(p + "self_attn.q_proj.bias", q, bias)),
                k=Linear(self.matrix(p + "self_attn.k_proj.weight", (kv, h)), self.bias(p + "self_attn.k_proj.bias", kv, bias)),
                v=Linear(self.matrix(p + "self_attn.v_proj.weight", (kv, h)), self.bias(p + "self_attn.v_proj.bias", kv, bias)),
                o=Linear(self.matrix(p + "self_attn.o_proj.weight", (h, q))),
                q_norm=self.vector(p + "self_attn.q_norm.weight", cfg.head_dim) if cfg.qk_norm else None,
                k_norm=self.vector(p + "self_attn.k_norm.weight", cfg.head_dim) if cfg.qk_norm else None,
                mlp_norm=self.vector(p + "post_attention_layernorm.weight", h),
                **mlp,
            ))

    def moe_mlp(self, p) -> dict:
        """A layer of experts' Layer fields: the router, the experts, Qwen2-MoE's shared expert."""
        cfg, shared = self.cfg, self.cfg.shared_expert_intermediate_size
        return dict(gate=None, up=None, down=None,
                    router=Linear(self.matrix(p + "mlp.gate.weight", (cfg.num_experts, cfg.hidden_size))),
                    experts=self.experts(p + "mlp.experts."),
                    shared=self.mlp(p + "mlp.shared_expert.", shared) if shared else None,
                    shared_gate=Linear(self.matrix(p + "mlp.shared_expert_gate.weight", (1, cfg.hidden_size)))
                    if shared else None)

    def mlp(self, prefix, inter) -> tuple:
        """(gate, up, down) of an MLP of width `inter` under prefix."""
        h = self.cfg.hidden_size
        return (Linear(self.matrix(prefix + "gate_proj.weight", (inter, h))),
                Linear(self.matrix(prefix + "up_proj.weight", (inter, h))),
                Linear(self.matrix(prefix + "down_proj.weight", (h, inter))))

    def experts(self, prefix) -> list:
        """A layer's experts as (gate, up, down) Linears. Checkpoints store them one matrix per
        expert (`experts.E.gate_proj.weight`, as published), or stacked in 3-D tensors: a GGUF's
        `ffn_*_exps` (`experts.gate_proj.weight` [experts, rows, cols] here) or transformers'
        fused `experts.gate_up_proj` [experts, 2 x rows, cols]; those are cut into per-expert
        views of the same bytes."""
        cfg = self.cfg
        n, h, inter = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        if prefix + "0.gate_proj.weight" in self.tensors:
            return [self.mlp(f"{prefix}{e}.", inter) for e in range(n)]
        if prefix + "gate_up_proj" in self.tensors:
            gate_up = self.stacked(prefix + "gate_up_proj", (n, 2 * inter, h))
            gates = [self._rows(t, 0, inter) for t in gate_up]
            ups = [self._rows(t, inter, inter) for t in gate_up]
            downs = self.stacked(prefix + "down_proj", (n, h, inter))
        else:
            gates = self.stacked(prefix + "gate_proj.weight", (n, inter, h))
            ups = self.stacked(prefix + "up_proj.weight", (n, inter, h))
            downs = self.stacked(prefix + "down_proj.weight", (n, h, inter))
        return [tuple(Linear(self.convert(t)) for t in trio) for trio in zip(gates, ups, downs)]

    def stacked(self, name, shape) -> list:
        """A 3-D tensor [n, rows, cols] as n matrices viewing its bytes."""
        t = self.get(name, shape)
        n, rows, cols = shape
        per = t.data.nbytes // n
        return [Tensor(f"{name}[{e}]", t.dtype, (rows, cols), t.data[e * per:(e + 1) * per], t.source)
                for e in range(n)]

    @staticmethod
    def _rows(t: Tensor, r0: int, n: int) -> Tensor:
        per = t.data.nbytes // t.shape[0]
        return Tensor(t.name, t.dtype, (n, t.shape[1]), t.data[r0 * per:(r0 + n) * per], t.source)

    def linears(self):
        """Every weight matrix the products read: each layer's attention and MLP (or router and
        experts), then the output head."""
        for layer in self.layers:
            yield from (layer.q, layer.k, layer.v, layer.o)
            yield from layer.mlp_linears()
        yield self.head

    def linears_per_token(self):
        """(Linear, share): each matrix with the share of it one token reads, 1 but for experts,
        of which a token reads num_experts_per_tok out of num_experts (on average)."""
        cfg = self.cfg
        share = cfg.num_experts_per_tok / cfg.num_experts if cfg.num_experts else 1.0
        experts = {id(lin) for layer in self.layers for expert in layer.experts or () for lin in expert}
        for lin in self.linears():
            yield lin, share if id(lin) in experts else 1.0

    def repack(self, integer: bool = True) -> bool:
        """Repack the matrices that have a row-interleaved layout (see the module doc): with
        `integer`, every block-quantized one for the integer path; BF16 ones always, for the
        float row kernel. A Linear keeps its original Tensor where it is a file mapping (a tied
        head's is the embedding, whose rows the lookup reads from the file); an in-memory tied
        table is kept once, repacked, and the lookup reads that. True when any block-quantized
        matrix was repacked (the integer path is used)."""
        integer_packed = False
        arena = Arena(sum(-(-lin.repack_bytes(integer) // 64) * 64 for lin in self.linears()))
        for lin in self.linears():
            lin.repack(arena=arena, integer=integer)
            integer_packed |= lin.integer
        if self.head.weight is self.head.packed:  # its in-memory original dropped: no reference kept
            if self.lm_head is self.embed:
                self.embed = self.head.packed
            self.lm_head = self.head.packed
        return integer_packed

    def embed_lookup_only(self) -> bool:
        """Whether only the token lookup reads the embedding table: not when a tied head
        multiplies by it as stored (it reads every row each step)."""
        return self.head._matrix() is not self.embed

    def get(self, name, shape) -> Tensor:
        t = self.tensors.get(name)
        if t is None:
            where = sorted({x.source for x in self.tensors.values()})
            raise WeightError(f"tensor {name} missing from {', '.join(where) or 'the checkpoint'}")
        if tuple(t.shape) != tuple(shape):
            raise WeightError(f"tensor {name} in {t.source} has shape {list(t.shape)}, expected {list(shape)}")
        # Refused here, at load, rather than by the first matmul: the file holds a type (Q2_K,
        # Q3_K, IQ*, ...) the kernels have no code for.
        if t.dtype not in BLOCK:
            raise WeightError(f"tensor {name} in {t.source} is stored as {_type_name(t.dtype)}, which qwenc "
                              f"cannot compute with (supported: {', '.join(DTYPE_NAMES.values())})")
        rows, cols = int(np.prod(t.shape[:-1])), t.shape[-1]  # a stack of experts' matrices is rows too
        if cols % BLOCK[t.dtype][0] or t.data.nbytes != row_bytes(t.dtype, cols) * rows:
            raise WeightError(f"tensor {name} in {t.source}: {t.data.nbytes} bytes do not hold "
                              f"{list(t.shape)} {_type_name(t.dtype)} values")
        return t

    def matrix(self, name, shape) -> Tensor:
        t = self.convert(self.get(name, shape))
        if t.dtype == F32 and t.data.dtype != np.uint8:
            raise WeightError(f"tensor {name}: internal error, data must be raw bytes")
        return t

    def vector(self, name, n) -> np.ndarray:
        return np.ascontiguousarray(self.get(name, (n,)).to_f32(), dtype=np.float32)

    def bias(self, name, n, expected: bool):
        if not expected:
            return None
        return self.vector(name, n)


# Rows repacked per piece: a few MB, so that a large matrix (an output head of 150k rows) never
# has its stored pages and its whole repacked copy resident at once.
REPACK_PIECE_ROWS = 4096


class Arena:
    """Memory that the weight matrices made at load (repacked or re-encoded) are carved from, in
    order, in chunks of at least `chunk` bytes (64 MB unless told). Large arrays get transparent huge pages (numpy asks the
    kernel for them from 4 MB up, where the kernel is set to give them on request), but matrices
    under 4 MB each on their own got 4 KiB pages (all of the 0.5B's but the output head, the
    1.5B's q, k, v and o), and decode, which reads every matrix once per token, then missed the
    TLB at every page. Carved from one arena, decode (2 threads, a Xeon with 2 MiB of L2 a core)
    ran 30-35% faster on the 0.5B (int8 and int16) and 4-10% on the 1.5B. A chunk lives as long
    as any matrix carved from it (each is a view of it), so an original dropped after its
    repacking is freed with the last of its chunk; a chunk's unused tail is never written, so it
    takes no memory beyond the huge page its last matrix ends in."""

    CHUNK = 64 << 20

    def __init__(self, first: int = 0, chunk: int = CHUNK):
        """`first`: the bytes the first chunk should hold at least (the total about to be taken);
        `chunk`: at least 4 MB, for the huge pages."""
        self.first, self.chunk, self.buf, self.at = first, chunk, None, 0

    def take(self, nbytes: int) -> np.ndarray:
        """nbytes of uninitialised memory, 64-byte aligned."""
        if self.buf is None or self.at + nbytes > self.buf.nbytes:
            size = max(self.chunk, nbytes, self.first if self.buf is None else 0)
            self.buf = np.empty(size + 4096, np.uint8)
            self.at = -self.buf.__array_interface__["data"][0] % 4096
        out = self.buf[self.at:self.at + nbytes]
        self.at += -(-nbytes // 64) * 64
        return out


def _repack_in_pieces(w: Tensor, arena: Arena = None):
    """W's row-interleaved copy, built a piece of rows at a time into one buffer (from `arena`
    if given), the stored pages of each piece released as soon as it is copied: (data, type
    code, whether W is a view of a file mapping)."""
    n, k = w.shape
    code, rb = _ops.r8_of(w.dtype), row_bytes(w.dtype, k)
    flat = w.data.reshape(-1)
    nbytes = _ops.matrix_bytes(code, n, k)
    out = arena.take(nbytes) if arena is not None else np.empty(nbytes, np.uint8)
    mapped = True
    for r0 in range(0, n, REPACK_PIECE_ROWS):  # a multiple of 8: pieces fill consecutive groups
        r1 = min(n, r0 + REPACK_PIECE_ROWS)
        piece = flat[r0 * rb:r1 * rb]
        _ops.repack(piece, w.dtype, r1 - r0, k, out[_ops.matrix_bytes(code, r0, k):_ops.matrix_bytes(code, r1, k)])
        mapped = release_pages(piece) and mapped
    return out, code, mapped


def release_pages(data: np.ndarray):
    """Let the OS drop this process's pages of a read-only file mapping that `data` views (after
    it was copied elsewhere): they are clean, so a later read just maps them in again. Keeps the
    resident size at about one copy of the weights while they are repacked. Returns False (and
    does nothing) for data that is not a view of an mmap."""
    root, base = data, data.base
    while isinstance(base, np.ndarray):
        root, base = base, base.base
    if isinstance(base, memoryview):  # np.frombuffer(mmap) keeps a memoryview of it
        base = base.obj
    if not isinstance(base, mmap.mmap) or not hasattr(base, "madvise"):
        return False
    start = data.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    page = mmap.PAGESIZE
    first, last = -(-start // page) * page, (start + data.nbytes) // page * page  # whole pages inside
    if last > first:
        try:
            base.madvise(mmap.MADV_DONTNEED, first, last - first)
        except (OSError, ValueError):
            pass
    return True


# ---------------------------------------------------------------- weight type conversion

def _f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    bits = x.astype(np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))  # round to nearest even
    return (rounded >> 16).astype(np.uint16)


def convert_tensor(t: Tensor, dtype: str, arena: Arena = None) -> Tensor:
    """t re-encoded as `dtype` (a new in-memory copy, from `arena` if given), or t itself when
    nothing changes."""
    target = {"f32": F32, "bf16": BF16, "q8_0": Q8_0}[dtype]
    if t.dtype == target:
        return t
    rows, cols = t.shape
    out = []
    step = max(1, (1 << 22) // cols)  # convert in slices: never a float copy of the whole matrix
    row_size = None
    for r0 in range(0, rows, step):
        part = Tensor(t.name, t.dtype, (min(step, rows - r0), cols), _row_slice(t, r0, step), t.source)
        x = part.to_f32()
        if target == F32:
            enc = x.view(np.uint8).reshape(-1)
        elif target == BF16:
            enc = _f32_to_bf16_bits(x).view(np.uint8).reshape(-1)
        else:
            if cols % 32:
                raise ValueError(f"{t.name}: {cols} columns are not a multiple of 32; cannot use q8_0")
            from .. import _quant
            enc = np.asarray(_quant.quantize_q8_0(np.ascontiguousarray(x))).reshape(-1)
        out.append(enc)
        row_size = enc.size // x.shape[0]
    assert sum(e.size for e in out) == row_size * rows
    if arena is not None:
        data = np.concatenate(out, out=arena.take(row_size * rows))
    else:
        data = np.ascontiguousarray(np.concatenate(out) if len(out) > 1 else out[0])
    return Tensor(t.name, target, t.shape, data, t.source)


def _row_slice(t: Tensor, r0: int, n: int) -> np.ndarray:
    rb = row_bytes(t.dtype, t.shape[1])
    return t.data[r0 * rb:(r0 + n) * rb]
