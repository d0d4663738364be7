"""The Qwen forward pass: embeddings, decoder blocks over a per-sequence KV cache, output head.

Read it top to bottom like a paper's pseudo-code: `_block` is one decoder layer, `_forward` runs
a batch of (sequence, new tokens) pairs through all of them. The arithmetic is in C (qwenc._ops);
this file only moves buffers around. Weights stay as stored (BF16, F16, F32 or GGUF blocks) in
memory-mapped files; activations are float32.

Qwen2 and Qwen3 differ in two places, both flags of ModelConfig: Qwen2's q/k/v projections carry
biases, and Qwen3 RMS-normalises each query and key head before RoPE.
"""
import os
from dataclasses import dataclass

import numpy as np

from . import _ops
from ._ops import ACTIVATIONS
from .config import ModelConfig
from .generation_config import resolve_sampling
from .sampler import Sampler, SamplingParams

SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed")
from .tensors import F32, Tensor

PREFILL_CHUNK = 512  # prompt tokens per forward step: bounds activation memory on long prompts


class WeightError(ValueError):
    pass


class ContextLengthExceeded(ValueError):
    """A sequence would grow past the KV cache allocated for it (`context=` at load)."""


# ---------------------------------------------------------------- weights

@dataclass
class Linear:
    """y = x @ W.T (+ b): W stays in its stored type; b (if any) is float32."""
    weight: Tensor
    bias: np.ndarray = None

    @property
    def out_features(self):
        return self.weight.shape[0]

    def __call__(self, x: np.ndarray, out: np.ndarray, act: int = 0):
        w = self.weight
        _ops.matmul(w.data, w.dtype, w.shape[0], w.shape[1], x, out, self.bias, act)
        return out

    def product(self, out: np.ndarray):
        """This layer's part of a group product (_ops.matmul_group) writing into out."""
        w = self.weight
        return (w.data, w.dtype, w.shape[0], out, self.bias)


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
    gate: Linear            # [intermediate, hidden]
    up: Linear              # [intermediate, hidden]
    down: Linear            # [hidden, intermediate]


class Weights:
    """Picks the tensors a config needs out of a {name: Tensor} map, checking every shape."""

    def __init__(self, cfg: ModelConfig, tensors: dict, convert=None):
        self.cfg, self.tensors, self.convert = cfg, tensors, convert or (lambda t: t)
        h, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
        self.embed = self.matrix("model.embed_tokens.weight", (cfg.vocab_size, h))
        self.norm = self.vector("model.norm.weight", h)
        if "lm_head.weight" in tensors and not cfg.tie_word_embeddings:
            self.lm_head = self.matrix("lm_head.weight", (cfg.vocab_size, h))
        else:  # tied: a tied checkpoint may still carry lm_head.weight; the embedding is the truth
            self.lm_head = self.embed
        self.layers = []
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            bias = cfg.attention_bias
            self.layers.append(Layer(
                attn_norm=self.vector(p + "input_layernorm.weight", h),
                q=Linear(self.matrix(p + "self_attn.q_proj.weight", (q, h)), self.bias(p + "self_attn.q_proj.bias", q, bias)),
                k=Linear(self.matrix(p + "self_attn.k_proj.weight", (kv, h)), self.bias(p + "self_attn.k_proj.bias", kv, bias)),
                v=Linear(self.matrix(p + "self_attn.v_proj.weight", (kv, h)), self.bias(p + "self_attn.v_proj.bias", kv, bias)),
                o=Linear(self.matrix(p + "self_attn.o_proj.weight", (h, q))),
                q_norm=self.vector(p + "self_attn.q_norm.weight", cfg.head_dim) if cfg.qk_norm else None,
                k_norm=self.vector(p + "self_attn.k_norm.weight", cfg.head_dim) if cfg.qk_norm else None,
                mlp_norm=self.vector(p + "post_attention_layernorm.weight", h),
                gate=Linear(self.matrix(p + "mlp.gate_proj.weight", (inter, h))),
                up=Linear(self.matrix(p + "mlp.up_proj.weight", (inter, h))),
                down=Linear(self.matrix(p + "mlp.down_proj.weight", (h, inter))),
            ))

    def get(self, name, shape) -> Tensor:
        t = self.tensors.get(name)
        if t is None:
            where = sorted({x.source for x in self.tensors.values()})
            raise WeightError(f"tensor {name} missing from {', '.join(where) or 'the checkpoint'}")
        if tuple(t.shape) != tuple(shape):
            raise WeightError(f"tensor {name} in {t.source} has shape {list(t.shape)}, expected {list(shape)}")
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


# ---------------------------------------------------------------- KV cache

class Sequence:
    """One conversation's state: the tokens whose keys/values are cached, and the cache itself.

    The cache belongs to the sequence, not to the model, so one model serves many sequences (and a
    batched decode step advances several at once). Memory: 2 x layers x kv_heads x capacity x
    head_dim float32, allocated once here.
    """

    def __init__(self, cfg: ModelConfig, capacity: int):
        self.capacity = capacity
        shape = (cfg.num_kv_heads, capacity, cfg.head_dim)
        self.k = [np.zeros(shape, dtype=np.float32) for _ in range(cfg.num_layers)]
        self.v = [np.zeros(shape, dtype=np.float32) for _ in range(cfg.num_layers)]
        self.tokens = []  # ids whose keys/values are in the cache, in order

    def __len__(self):
        return len(self.tokens)

    def truncate(self, n: int):
        """Forget everything after the first n tokens (their cache slots are overwritten later)."""
        del self.tokens[n:]

    def common_prefix(self, ids) -> int:
        n = 0
        for a, b in zip(self.tokens, ids):
            if a != b:
                break
            n += 1
        return n


class Workspace:
    """Activation buffers for a step of T tokens, reused across steps of the same size."""

    def __init__(self, cfg: ModelConfig, T: int):
        f = np.float32
        self.T = T
        self.x = np.empty((T, cfg.hidden_size), f)       # residual stream
        self.h = np.empty((T, cfg.hidden_size), f)       # normalised input of a sub-block
        self.q = np.empty((T, cfg.q_size), f)
        self.k = np.empty((T, cfg.kv_size), f)
        self.v = np.empty((T, cfg.kv_size), f)
        self.attn = np.empty((T, cfg.q_size), f)
        self.o = np.empty((T, cfg.hidden_size), f)       # output of a sub-block, added to x
        self.gate = np.empty((T, cfg.intermediate_size), f)
        self.up = np.empty((T, cfg.intermediate_size), f)


# ---------------------------------------------------------------- the model

def default_threads() -> int:
    env = os.environ.get("QWENC_THREADS")
    if env:
        return max(1, int(env))
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class Model:
    def __init__(self, cfg: ModelConfig, weights: Weights, tokenizer=None, context: int = 4096,
                 threads: int = None, generation_defaults: dict = None, chat_template: str = None,
                 source: str = "", activations: str = "f32"):
        if activations not in ACTIVATIONS:
            raise ValueError(f"activations must be one of {tuple(ACTIVATIONS)}, got {activations!r}")
        self.config = cfg
        self.weights = weights
        self.tokenizer = tokenizer
        self.context = int(context)
        if self.context < 1:
            raise ValueError(f"context must be >= 1, got {context}")
        self.threads = threads or default_threads()
        _ops.set_threads(self.threads)
        self.generation_defaults = dict(generation_defaults or {})
        self.chat_template = chat_template
        self.source = source
        # "f32" computes what transformers computes on the dequantized weights; "int8" rounds
        # decode's activations to 8 bits for integer dots on quantized weights (faster, not exact).
        self.activations = activations
        self._act = ACTIVATIONS[activations]
        hd = cfg.head_dim
        # float32 throughout, as the reference computes it: theta ** (2i / hd), then 1 / that.
        exponent = np.arange(0, hd, 2, dtype=np.int64).astype(np.float32) / np.float32(hd)
        self.inv_freq = (np.float32(1.0) / (np.float32(cfg.rope_theta) ** exponent)).astype(np.float32)
        self.scale = float(1.0 / np.sqrt(hd))
        self._workspaces = {}
        eos = list(cfg.eos_token_ids) + list(self.generation_defaults.get("eos_token_id", []))
        if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
            eos.append(tokenizer.eos_token_id)
        self.eos_token_ids = tuple(dict.fromkeys(eos))

    # -- sizes -------------------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        """Tokens that can be produced: the tokenizer's real vocabulary, not the padded rows."""
        if self.tokenizer is not None:
            return min(self.tokenizer.vocab_size, self.config.vocab_size)
        return self.config.vocab_size

    def new_sequence(self, capacity: int = None) -> Sequence:
        return Sequence(self.config, capacity or self.context)

    def _workspace(self, T: int) -> Workspace:
        ws = self._workspaces.get(T)
        if ws is None:
            if len(self._workspaces) > 8:  # keep decode's (T=1..batch) and a few prefill sizes
                self._workspaces.clear()
            ws = self._workspaces[T] = Workspace(self.config, T)
        return ws

    # -- forward -----------------------------------------------------------------------------

    def _block(self, layer: Layer, li: int, ws: Workspace, items):
        cfg = self.config
        T, hd = ws.T, cfg.head_dim
        _ops.rmsnorm(ws.x, layer.attn_norm, cfg.rms_norm_eps, ws.h)
        # q, k, v (then gate, up) read the same x: one pass over all their rows
        _ops.matmul_group([layer.q.product(ws.q), layer.k.product(ws.k), layer.v.product(ws.v)], ws.h, self._act)
        q = ws.q.reshape(T, cfg.num_heads, hd)
        k = ws.k.reshape(T, cfg.num_kv_heads, hd)
        if layer.q_norm is not None:
            _ops.rmsnorm(ws.q.reshape(-1, hd), layer.q_norm, cfg.rms_norm_eps, ws.q.reshape(-1, hd))
            _ops.rmsnorm(ws.k.reshape(-1, hd), layer.k_norm, cfg.rms_norm_eps, ws.k.reshape(-1, hd))
        v = ws.v.reshape(T, cfg.num_kv_heads, hd)
        attn = ws.attn.reshape(T, cfg.num_heads, hd)
        for seq, r0, r1, start, pos in items:
            _ops.rope(q[r0:r1], pos, self.inv_freq)
            _ops.rope(k[r0:r1], pos, self.inv_freq)
            seq.k[li][:, start:start + r1 - r0, :] = k[r0:r1].transpose(1, 0, 2)
            seq.v[li][:, start:start + r1 - r0, :] = v[r0:r1].transpose(1, 0, 2)
            _ops.attention(q[r0:r1], seq.k[li], seq.v[li], start, self.scale, attn[r0:r1])
        layer.o(ws.attn, ws.o, self._act)
        ws.x += ws.o
        _ops.rmsnorm(ws.x, layer.mlp_norm, cfg.rms_norm_eps, ws.h)
        _ops.matmul_group([layer.gate.product(ws.gate), layer.up.product(ws.up)], ws.h, self._act)
        g = ws.gate.reshape(-1)
        _ops.silu_mul(g, ws.up.reshape(-1), g)
        layer.down(ws.gate, ws.o, self._act)
        ws.x += ws.o

    def _forward(self, batch, all_positions=False) -> np.ndarray:
        """Run new tokens of one or more sequences through the model, appending to their caches.

        batch: list of (Sequence, list of token ids). Returns float32 logits: one row per
        sequence (its last new token), or one per new token when all_positions.
        """
        cfg, w = self.config, self.weights
        items, ids, r = [], [], 0
        for seq, toks in batch:
            start = len(seq)
            if start + len(toks) > seq.capacity:
                raise ContextLengthExceeded(
                    f"context_length_exceeded: {start + len(toks)} tokens do not fit the context of "
                    f"{seq.capacity} (load with a larger context=)")
            pos = np.arange(start, start + len(toks), dtype=np.int64)
            items.append((seq, r, r + len(toks), start, pos))
            ids.extend(toks)
            r += len(toks)
        ws = self._workspace(r)
        _ops.embed(w.embed.data, w.embed.dtype, cfg.vocab_size, cfg.hidden_size,
                   np.asarray(ids, dtype=np.int32), ws.x)
        for li, layer in enumerate(w.layers):
            self._block(layer, li, ws, items)
        for seq, r0, r1, _, _ in items:
            seq.tokens.extend(ids[r0:r1])
        rows = np.arange(r) if all_positions else np.array([it[2] - 1 for it in items])
        h = ws.h[:len(rows)] if len(rows) == r else np.empty((len(rows), cfg.hidden_size), np.float32)
        _ops.rmsnorm(np.ascontiguousarray(ws.x[rows]), w.norm, cfg.rms_norm_eps, h)
        logits = np.empty((len(rows), cfg.vocab_size), np.float32)
        Linear(w.lm_head)(h, logits, self._act)
        return logits

    def forward(self, seq: Sequence, ids, all_positions=False) -> np.ndarray:
        """Append `ids` to `seq`, in chunks; logits of the last token, or of every token."""
        ids = [int(t) for t in ids]
        if not ids:
            raise ValueError("forward needs at least one token")
        if len(seq) + len(ids) > seq.capacity:
            raise ContextLengthExceeded(
                f"context_length_exceeded: {len(seq) + len(ids)} tokens do not fit the context of "
                f"{seq.capacity} (load with a larger context=)")
        outs = []
        for c in range(0, len(ids), PREFILL_CHUNK):
            outs.append(self._forward([(seq, ids[c:c + PREFILL_CHUNK])], all_positions))
        return np.concatenate(outs) if all_positions else outs[-1][0]

    def decode_batch(self, seqs, tokens) -> np.ndarray:
        """One decode step for several sequences at once: logits [len(seqs), vocab]."""
        return self._forward([(s, [int(t)]) for s, t in zip(seqs, tokens)])

    def logits(self, ids, all_positions=False) -> np.ndarray:
        """Logits for a token sequence on a fresh cache: [vocab], or [len(ids), vocab]."""
        ids = list(ids)
        seq = self.new_sequence(max(len(ids), 1))
        return self.forward(seq, ids, all_positions)

    # -- generation --------------------------------------------------------------------------

    def sampling_params(self, **overrides) -> SamplingParams:
        """Sampling settings: explicit arguments win over generation_config.json's defaults."""
        merged = resolve_sampling(self.generation_defaults, **overrides)
        return SamplingParams(**{k: v for k, v in merged.items() if k in SAMPLING_FIELDS})

    def generate_tokens(self, ids, max_tokens=256, temperature=None, top_k=None, top_p=None, min_p=None,
                        repetition_penalty=None, seed=None, stop_token_ids=None, sequence=None):
        """Yield generated token ids one by one.

        Prefills `ids` (reusing the longest prefix already cached in `sequence`, if given), then
        samples up to `max_tokens` tokens. A stop token ends generation and is not yielded; the
        generator's return value is the finish reason, "stop" or "length".
        """
        params = self.sampling_params(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                      repetition_penalty=repetition_penalty, seed=seed)
        ids = [int(t) for t in ids]
        if not ids:
            raise ValueError("generation needs at least one prompt token")
        stops = set(self.eos_token_ids if stop_token_ids is None else (int(t) for t in stop_token_ids))
        seq = sequence if sequence is not None else self.new_sequence()
        if len(ids) > seq.capacity:
            raise ContextLengthExceeded(
                f"context_length_exceeded: the prompt has {len(ids)} tokens, the context holds {seq.capacity}")
        # Keep the cached prefix, but always recompute at least the last prompt token's logits.
        keep = min(seq.common_prefix(ids), len(ids) - 1)
        seq.truncate(keep)
        logits = self.forward(seq, ids[keep:])
        sampler = Sampler(params, self.n_vocab, history=ids)
        for i in range(max_tokens):
            token = sampler.sample(logits)
            if token in stops:
                return "stop"
            yield token
            sampler.observe(token)
            if i + 1 == max_tokens or len(seq) + 1 > seq.capacity:
                break
            logits = self.forward(seq, [token])
        return "length"

    # -- text --------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return os.path.basename(str(self.source).rstrip("/")) or "qwenc"

    def generate(self, prompt: str, max_tokens=256, stop=None, **sampling) -> str:
        """Complete `prompt` (raw text, no chat template) and return the new text."""
        from .textgen import Generation
        return Generation(self, self.tokenizer_or_raise().encode(prompt), max_tokens, stop, **sampling).run()

    def stream(self, prompt: str, max_tokens=256, stop=None, **sampling):
        """Like generate, yielding text pieces as they become final."""
        from .textgen import Generation
        return iter(Generation(self, self.tokenizer_or_raise().encode(prompt), max_tokens, stop, **sampling))

    def chat(self, messages, stream=False, max_tokens=256, stop=None, tools=None, **kwargs):
        """An OpenAI-shaped chat completion (a dict, or chunk dicts when stream=True).

        Keyword arguments that are not sampling settings (e.g. enable_thinking=False for Qwen3)
        are passed to the chat template."""
        from .textgen import chat_completion
        sampling = {k: kwargs.pop(k) for k in list(kwargs) if k in SAMPLING_FIELDS}
        return chat_completion(self, messages, stream=stream, tools=tools, template_kwargs=kwargs,
                               max_tokens=max_tokens, stop=stop, **sampling)

    def tokenizer_or_raise(self):
        from .textgen import _require_tokenizer
        return _require_tokenizer(self)
