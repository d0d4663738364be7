"""The Qwen forward pass: embeddings, decoder blocks over a paged KV cache, output head.

Read it top to bottom like a paper's pseudo-code: `_block` is one decoder layer, `forward_step`
runs one step (new tokens of one or more sequences) through all of them. The arithmetic is in C
(qwenc._ops); this file only moves buffers around. Weights stay as stored (BF16, F16, F32 or GGUF
blocks) in memory-mapped files; activations are float32.

Keys and values live in a `KVCache`: per layer, one pool of fixed-size blocks shared by every
sequence that uses it; a sequence owns a block table (which blocks hold its positions). The
engine's block manager hands blocks out of one big cache; `Sequence` is the simple case of a
sequence with a private cache of its own.

Qwen2 and Qwen3 differ in two places, both flags of ModelConfig: Qwen2's q/k/v projections carry
biases, and Qwen3 RMS-normalises each query and key head before RoPE.

A step's rows are computed independently of each other: every kernel gives a row the same
arithmetic whatever else the step holds, so a sequence's logits do not depend on what it is
batched with.
"""
import os
import sys
import weakref
from dataclasses import dataclass

import numpy as np

from .. import _ops
from .._ops import ACTIVATIONS, KV_DTYPES
from ..errors import ContextLengthExceeded, InvalidRequest
from ..formats.config import ModelConfig
from .rope import rope_frequencies
from .weights import Layer, Weights, release_pages

BLOCK_SIZE = 16       # token positions per KV block
EMBED_RELEASE_ROWS = 64  # steps of this many tokens or more drop the embedding table's pages after the lookup
PREFILL_CHUNK = 512   # prompt tokens per step in Transformer.forward: bounds activation memory


# ---------------------------------------------------------------- KV cache

class KVCache:
    """Keys and values in blocks of BLOCK_SIZE positions: per layer, a K pool
    [kv_heads, num_blocks, head_dim, BLOCK_SIZE] and a V pool [kv_heads, num_blocks, BLOCK_SIZE,
    head_dim] (a block's vectors of one kv head are contiguous, and so are a kv head's blocks
    handed out in order: attention streams each head's run), of float32 or float16 ("f32",
    "f16": KV_DTYPES)."""

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int = BLOCK_SIZE, prefault: bool = False,
                 dtype: str = "f32"):
        if num_blocks < 1:
            raise InvalidRequest(f"a KV cache needs at least one block, got {num_blocks}")
        if dtype not in KV_DTYPES:
            raise InvalidRequest(f"kv_cache must be one of {tuple(KV_DTYPES)}, got {dtype!r}")
        self.num_blocks, self.block_size, self.dtype = int(num_blocks), int(block_size), dtype
        # keys transposed within a block (a key down a column): attention reads one dimension of
        # a block's keys as a vector and scores every query head of the group against it at once
        kshape = (cfg.num_kv_heads, self.num_blocks, cfg.head_dim, self.block_size)
        vshape = (cfg.num_kv_heads, self.num_blocks, self.block_size, cfg.head_dim)
        self.k = [np.zeros(kshape, KV_DTYPES[dtype]) for _ in range(cfg.num_layers)]
        self.v = [np.zeros(vshape, KV_DTYPES[dtype]) for _ in range(cfg.num_layers)]
        # (model, workspace, _ops.LayerStack): the layers bound to these pools (Transformer._layer_stack)
        self.layer_stack = None
        if prefault:
            # np.zeros maps pages lazily; a server's cache is touched now, so its memory is
            # taken (and visible) at start, not crept into as blocks are first used
            for a in self.k + self.v:
                a.fill(0)

    @staticmethod
    def block_bytes(cfg: ModelConfig, block_size: int = BLOCK_SIZE, dtype: str = "f32") -> int:
        """Bytes one block takes over all layers (keys and values)."""
        return 2 * cfg.num_layers * cfg.num_kv_heads * block_size * cfg.head_dim * np.dtype(KV_DTYPES[dtype]).itemsize


class Sequence:
    """One sequence's state: the tokens whose keys/values are cached, and where they are.

    `tokens` are the ids already in the cache, `block_table` the blocks holding them (position p
    is slot p % block_size of block block_table[p // block_size]), `capacity` the most positions
    the table may hold. Built by Model.new_sequence with a private cache, by Sequence.shared over
    one cache for several, or by the engine over its shared one.
    """

    def __init__(self, cache: KVCache, block_table, capacity: int):
        self.cache = cache
        self.block_table = np.asarray(block_table, dtype=np.int32)
        self.capacity = int(capacity)
        self.tokens = []

    @classmethod
    def private(cls, cfg: ModelConfig, capacity: int, kv_dtype: str = "f32") -> "Sequence":
        return cls.shared(cfg, [capacity], kv_dtype)[0]

    @classmethod
    def shared(cls, cfg: ModelConfig, capacities, kv_dtype: str = "f32") -> list:
        """Sequences of these capacities over one cache, each holding its own run of blocks, as
        the engine's are: a step over them is one group (the fused layer stack), where private
        caches would each be a group of their own."""
        blocks = [-(-int(c) // BLOCK_SIZE) for c in capacities]
        cache = KVCache(cfg, sum(blocks), dtype=kv_dtype)
        starts = np.cumsum([0] + blocks[:-1])
        return [cls(cache, np.arange(a, a + n, dtype=np.int32), c) for a, n, c in zip(starts, blocks, capacities)]

    def __len__(self):
        return len(self.tokens)

    def truncate(self, n: int):
        """Forget everything after the first n tokens (their slots are overwritten later)."""
        del self.tokens[n:]

    def common_prefix(self, ids) -> int:
        n = 0
        for a, b in zip(self.tokens, ids):
            if a != b:
                break
            n += 1
        return n


@dataclass
class StepItem:
    """New tokens of one sequence in a step, and which of their logits the caller wants:
    "last" (the last new token's), "all" (every new token's) or "none"."""
    seq: Sequence
    tokens: list
    logits: str = "last"


def aligned_bytes(n: int, align: int = 64) -> np.ndarray:
    """n bytes starting at a multiple of `align` (numpy only promises 16)."""
    raw = np.empty(n + align, np.uint8)
    at = -raw.ctypes.data % align
    return raw[at:at + n]


class Workspace:
    """Activation buffers for steps of up to `capacity` tokens; a step of T tokens uses the first
    T rows of each (contiguous views), so steps of every size share one allocation."""

    def __init__(self, cfg: ModelConfig, capacity: int):
        f = np.float32
        self.capacity = capacity
        self._x = np.empty((capacity, cfg.hidden_size), f)       # residual stream
        self._h = np.empty((capacity, cfg.hidden_size), f)       # normalised input of a sub-block
        self._q = np.empty((capacity, cfg.q_size), f)
        self._k = np.empty((capacity, cfg.kv_size), f)
        self._v = np.empty((capacity, cfg.kv_size), f)
        self._attn = np.empty((capacity, cfg.q_size), f)
        self._o = np.empty((capacity, cfg.hidden_size), f)       # output of a sub-block, added to x
        # the dense MLP's scratch (none when every layer has experts, which bring their own)
        inter = cfg.intermediate_size if len(cfg.moe_layers) < cfg.num_layers else 0
        self._gate = np.empty((capacity, inter), f)
        self._up = np.empty((capacity, inter), f)
        self._rope = np.empty((capacity, cfg.head_dim), f)        # the fused step's RoPE cos and sin
        # the layers of experts' scratch (csrc/moe.h), 64-byte aligned
        self.moe_scratch = None
        if cfg.moe_layers:
            n = _ops.moe_scratch_bytes(cfg.hidden_size, cfg.num_experts, cfg.num_experts_per_tok,
                                       cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size, capacity)
            self.moe_scratch = aligned_bytes(n)
        self.use(capacity)

    def use(self, T: int):
        self.T = T
        for name in ("x", "h", "q", "k", "v", "attn", "o", "gate", "up"):
            setattr(self, name, getattr(self, "_" + name)[:T])
        return self


class _Group:
    """The rows of a step whose sequences share one KV cache: where their new keys go and what
    each row attends to."""

    def __init__(self, cache, rows, slots, row_seq, pos, tables):
        self.cache = cache
        self.rows = rows          # indices of these rows in the step (int64), or a slice
        self.slots = slots        # [n] block * block_size + offset of each row's new key
        self.row_seq = row_seq    # [n] row of `tables` for each row
        self.pos = pos            # [n] position of each row
        self.tables = tables      # [sequences, max_blocks] int32


# ---------------------------------------------------------------- the model

def default_threads() -> int:
    env = os.environ.get("QWENC_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise InvalidRequest(f"QWENC_THREADS must be a positive integer, got {env!r}") from None
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class Transformer:
    """The network: weights and the arithmetic of one step. Not thread-safe on its own (its
    activation buffers are shared): Model serialises the callers."""

    def __init__(self, cfg: ModelConfig, weights: Weights, threads: int = None, activations: str = "f32",
                 kv_cache: str = "auto"):
        if activations not in ACTIVATIONS:
            raise InvalidRequest(f"activations must be one of {tuple(ACTIVATIONS)}, got {activations!r}")
        if kv_cache != "auto" and kv_cache not in KV_DTYPES:
            raise InvalidRequest(f"kv_cache must be 'auto' or one of {tuple(KV_DTYPES)}, got {kv_cache!r}")
        if cfg.num_heads % cfg.num_kv_heads or cfg.num_heads // cfg.num_kv_heads > 64:
            raise InvalidRequest(f"{cfg.num_heads} query heads cannot share {cfg.num_kv_heads} kv heads")
        self.config = cfg
        self.weights = weights
        self.threads = int(threads or default_threads())
        if self.threads < 1:
            raise InvalidRequest(f"threads must be >= 1, got {threads}")
        # The kernels' thread count is process-wide: set at load so that it already holds for
        # kernels called outside a step, and again before every step, since another model loaded
        # since may have changed it.
        _ops.set_threads(self.threads)
        # "f32" computes what transformers computes on the dequantized weights; "int16"/"int8"
        # round activations to 16/8-bit codes for integer dots on block-quantized weights.
        self.activations = activations
        self._act = ACTIVATIONS[activations]
        hd = cfg.head_dim
        self.inv_freq, self.rope_mscale = rope_frequencies(cfg)
        self.scale = float(1.0 / np.sqrt(hd))
        self._ws = None
        self._logits_bytes = None  # the memory of the last step's logits (_logits_out)
        # Steps whose rows share one KV cache (every engine step, every single sequence) run
        # all their layers in one C call (_ops.forward_layers): the same kernels in the same
        # order as _block, without returning to Python between them. False runs _block's path.
        self.fused = True
        # the integer modes run on row-interleaved copies of the quantized weights; BF16 weights
        # take theirs in every mode (the float row kernel reads each 4 rows as one stream)
        integer = weights.repack(integer=bool(self._act)) and bool(self._act)
        self.bind_experts()
        # "auto": where the products already round activations (an integer mode on quantized
        # weights), keys and values are kept in 16 bits as well, halving what a long context
        # reads per token; the exact path (float activations, or float weights) keeps float32.
        self.kv_dtype = kv_cache if kv_cache != "auto" else ("f16" if integer else "f32")

    def bind_experts(self):
        """The C view of each layer of experts (None for a dense layer), from the config's routing
        and the layers' weights as they are now: called at load, and again by whoever changes
        either afterwards."""
        cfg = self.config
        products = lambda lins: tuple(lin.product(None) for lin in lins)
        self._moe = []
        for layer in self.weights.layers:
            ex = None
            if layer.experts is not None:
                shared = layer.shared is not None
                ex = _ops.Experts(cfg.hidden_size, cfg.num_experts_per_tok, cfg.norm_topk_prob,
                                  layer.router.product(None), [products(e) for e in layer.experts],
                                  products(layer.shared) if shared else None,
                                  layer.shared_gate.product(None) if shared else None)
            self._moe.append(ex)

    def _workspace(self, T: int) -> Workspace:
        ws = self._ws
        if ws is None or ws.capacity < T:
            ws = self._ws = Workspace(self.config, max(T, 16))
        return ws.use(T)

    # -- one decoder layer -------------------------------------------------------------------

    def _block(self, layer: Layer, li: int, ws: Workspace, pos: np.ndarray, groups):
        cfg = self.config
        T, hd = ws.T, cfg.head_dim
        _ops.rmsnorm(ws.x, layer.attn_norm, cfg.rms_norm_eps, ws.h)
        # q, k, v (then gate, up) read the same x: one pass over all their rows
        _ops.matmul_group([layer.q.product(ws.q), layer.k.product(ws.k), layer.v.product(ws.v)], ws.h, self._act)
        if layer.q_norm is not None:
            _ops.rmsnorm(ws.q.reshape(-1, hd), layer.q_norm, cfg.rms_norm_eps, ws.q.reshape(-1, hd))
            _ops.rmsnorm(ws.k.reshape(-1, hd), layer.k_norm, cfg.rms_norm_eps, ws.k.reshape(-1, hd))
        q = ws.q.reshape(T, cfg.num_heads, hd)
        k = ws.k.reshape(T, cfg.num_kv_heads, hd)
        v = ws.v.reshape(T, cfg.num_kv_heads, hd)
        attn = ws.attn.reshape(T, cfg.num_heads, hd)
        _ops.rope(q, pos, self.inv_freq, self.rope_mscale)
        _ops.rope(k, pos, self.inv_freq, self.rope_mscale)
        for g in groups:
            if isinstance(g.rows, slice):
                gq, gk, gv, go = q[g.rows], k[g.rows], v[g.rows], attn[g.rows]
            else:
                gq, gk, gv = q[g.rows], k[g.rows], v[g.rows]
                go = np.empty_like(gq)
            _ops.kv_write(gk, gv, g.slots, g.cache.k[li], g.cache.v[li])
            _ops.paged_attention(gq, g.cache.k[li], g.cache.v[li], g.tables, g.row_seq, g.pos, self.scale, go)
            if not isinstance(g.rows, slice):
                attn[g.rows] = go
        layer.o(ws.attn, ws.o, self._act)
        ws.x += ws.o
        _ops.rmsnorm(ws.x, layer.mlp_norm, cfg.rms_norm_eps, ws.h)
        if layer.experts is not None:
            _ops.moe_mlp(self._moe[li], ws.h, ws.o, ws.moe_scratch, self._act)
        else:
            _ops.matmul_group([layer.gate.product(ws.gate), layer.up.product(ws.up)], ws.h, self._act)
            g = ws.gate.reshape(-1)
            _ops.silu_mul(g, ws.up.reshape(-1), g)
            layer.down(ws.gate, ws.o, self._act)
        ws.x += ws.o

    # -- one step ----------------------------------------------------------------------------

    def forward_step(self, items) -> np.ndarray:
        """Run the new tokens of one or more sequences through the model, appending their keys
        and values to the caches and the tokens to each Sequence.

        items: StepItems (a sequence appears at most once). Returns float32 logits
        [rows, vocab]: for each item in order, its last new token's row ("last"), every new
        token's ("all"), or none.
        """
        cfg, w = self.config, self.weights
        if not items:
            return np.empty((0, cfg.vocab_size), np.float32)
        seen = set()
        ids, pos, wanted, r = [], [], [], 0
        for it in items:
            if id(it.seq) in seen:
                raise InvalidRequest("a sequence appears twice in one step")
            seen.add(id(it.seq))
            n, start = len(it.tokens), len(it.seq)
            if n == 0:
                raise InvalidRequest("a step item needs at least one token")
            if start + n > it.seq.capacity or -(-(start + n) // it.seq.cache.block_size) > len(it.seq.block_table):
                raise ContextLengthExceeded(
                    f"context_length_exceeded: {start + n} tokens do not fit the context of "
                    f"{it.seq.capacity} (load with a larger context=)")
            ids.extend(it.tokens)
            pos.extend(range(start, start + n))
            if it.logits == "all":
                wanted.extend(range(r, r + n))
            elif it.logits == "last":
                wanted.append(r + n - 1)
            elif it.logits != "none":
                raise InvalidRequest(f"logits must be 'last', 'all' or 'none', got {it.logits!r}")
            r += n
        # Python lists made into arrays once: after a step's kernels have swept the caches, each
        # small numpy call costs tens of microseconds, a few percent of a decode step in all
        pos = np.array(pos, dtype=np.int64)
        groups = self._groups(items, pos)
        _ops.set_threads(self.threads)
        ws = self._workspace(r)
        ids = np.asarray(ids, dtype=np.int32)
        if r >= EMBED_RELEASE_ROWS and w.embed_lookup_only():
            # Each row read from a memory-mapped table maps in the pages around it too (the
            # kernel's fault-around: 64 KiB per row), so a long prompt of scattered tokens
            # would leave most of the table resident; its pages are clean and are dropped again
            # (not when a tied head reads the whole table as stored: it would fault it all back),
            # after every EMBED_RELEASE_ROWS rows, so that a 512-token chunk does not hold 32 MiB
            # of them at its peak.
            for a in range(0, r, EMBED_RELEASE_ROWS):
                b = min(a + EMBED_RELEASE_ROWS, r)
                _ops.embed(w.embed.data, w.embed.dtype, cfg.vocab_size, cfg.hidden_size, ids[a:b], ws.x[a:b])
                release_pages(w.embed.data)
        else:
            _ops.embed(w.embed.data, w.embed.dtype, cfg.vocab_size, cfg.hidden_size, ids, ws.x)
        if self.fused and len(groups) == 1:
            g = groups[0]
            _ops.forward_layers(self._layer_stack(ws, g.cache), r, pos, g.slots, g.tables, g.row_seq)
        else:
            for li, layer in enumerate(w.layers):
                self._block(layer, li, ws, pos, groups)
        for it in items:
            it.seq.tokens.extend(int(t) for t in it.tokens)
        logits = self._logits_out(len(wanted), cfg.vocab_size)
        if wanted:
            a = wanted[0]
            x = ws.x[a:a + len(wanted)] if wanted[-1] == a + len(wanted) - 1 else ws.x[wanted]  # a run: a view
            h = np.empty((len(wanted), cfg.hidden_size), np.float32)
            _ops.rmsnorm(x, w.norm, cfg.rms_norm_eps, h)
            w.head(h, logits, self._act)
        return logits

    def _logits_out(self, rows: int, vocab: int) -> np.ndarray:
        """The step's logits array: in the last step's memory when nothing holds it any more (no
        view of it is alive: every view refers to the bytes' array), else in new memory, 64-byte
        aligned. A new 16 x 151,936 array for each step of 16 rows had its huge pages faulted in
        and cleared every step, and at numpy's 16-byte alignment each 16-output piece that the
        head's kernels write spanned two cache lines."""
        buf, n = self._logits_bytes, rows * vocab * 4
        # every view of the bytes refers to the array that owns them (buf.base): alive, it holds
        # one reference besides buf's and getrefcount's argument
        if buf is None or buf.size != n or sys.getrefcount(buf.base) > 2:
            buf = self._logits_bytes = aligned_bytes(n)
        return buf.view(np.float32).reshape(rows, vocab)

    def _layer_stack(self, ws: Workspace, cache: KVCache):
        """The C view of every layer bound to ws's buffers and cache's pools. It is kept on the
        cache, so it lives no longer than the pools it points into, and built again when the
        model or the workspace changes."""
        held = cache.layer_stack
        if held is None or held[0]() is not self or held[1] is not ws or held[2] is not self._moe:
            cfg = self.config
            bufs = (ws._x, ws._h, ws._q, ws._k, ws._v, ws._attn, ws._o, ws._gate, ws._up, ws._rope, ws.moe_scratch)
            dense = lambda L: ((L.gate.product(ws._gate), L.up.product(ws._up)), L.down.product(ws._o))
            layers = [(L.attn_norm, L.mlp_norm, L.q_norm, L.k_norm,
                       (L.q.product(ws._q), L.k.product(ws._k), L.v.product(ws._v)), L.o.product(ws._o),
                       *(dense(L) if ex is None else (None, None)), cache.k[li], cache.v[li], ex)
                      for li, (L, ex) in enumerate(zip(self.weights.layers, self._moe))]
            stack = _ops.LayerStack(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                                    ws._gate.shape[1], cfg.rms_norm_eps, self.scale, self.inv_freq,
                                    self._act, bufs, layers, self.rope_mscale)
            held = cache.layer_stack = (weakref.ref(self), ws, self._moe, stack)
        return held[3]

    @staticmethod
    def _groups(items, pos):
        """The step's rows grouped by KV cache (the engine's steps have one group)."""
        by_cache = {}
        r = 0
        for it in items:
            by_cache.setdefault(id(it.seq.cache), (it.seq.cache, []))[1].append((it, r))
            r += len(it.tokens)
        groups = []
        for cache, members in by_cache.values():
            bs = cache.block_size
            slots, row_seq, rows = [], [], []
            for s, (it, r0) in enumerate(members):
                n, start, table = len(it.tokens), len(it.seq), it.seq.block_table
                slots.extend(int(table[p // bs]) * bs + p % bs for p in range(start, start + n))
                row_seq.extend([s] * n)
                rows.extend(range(r0, r0 + n))
            if len(members) == 1:
                tables = np.ascontiguousarray(members[0][0].seq.block_table, np.int32)[None]
            else:
                width = max(len(it.seq.block_table) for it, _ in members)
                tables = np.zeros((len(members), width), np.int32)
                for s, (it, _) in enumerate(members):
                    tables[s, :len(it.seq.block_table)] = it.seq.block_table
            if len(by_cache) == 1:
                rows, gpos = slice(0, len(pos)), pos
            else:
                rows = np.array(rows, dtype=np.int64)
                gpos = np.ascontiguousarray(pos[rows])
            groups.append(_Group(cache, rows, np.array(slots, dtype=np.int64), np.array(row_seq, dtype=np.int32),
                                 gpos, tables))
        return groups
