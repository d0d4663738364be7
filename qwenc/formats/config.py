"""Model hyper-parameters, read from a HuggingFace config.json (transformers 4 or 5 layout).

Everything the forward pass needs is here, validated once at load, so that the model code can
trust it. Settings we do not implement (sliding window, RoPE scaling other than linear and YaRN)
are refused, not ignored: ignoring them would give a model that talks, but wrongly.
"""
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from .jsonfile import read_json

ARCHITECTURES = {"Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3", "Qwen2MoeForCausalLM": "qwen2_moe",
                 "Qwen3MoeForCausalLM": "qwen3_moe"}


@dataclass(frozen=True)
class RopeScaling:
    """How RoPE's frequencies are stretched past the trained context, in transformers' terms.

    "linear" divides every frequency by `factor`; "yarn" (what Qwen's model cards prescribe for
    long inputs) divides only the slow ones, ramping between `beta_fast` and `beta_slow`
    rotations over `original_max_position_embeddings`, and scales cos and sin by
    `attention_factor`. Both are static: the same at every position, whatever the batch."""
    kind: str = "default"     # "default", "linear" or "yarn"
    factor: float = 1.0
    original_max_position_embeddings: int = 0
    attention_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True


@dataclass(frozen=True)
class ModelConfig:
    arch: str                 # "qwen2" (q/k/v biases), "qwen3" (q/k RMSNorm per head), "qwen2_moe", "qwen3_moe"
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int             # explicit in Qwen3 configs; never assume hidden / heads there
    intermediate_size: int
    vocab_size: int           # rows of the embedding (padded past the real token count)
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool      # q/k/v projections carry biases (Qwen2: yes; Qwen3: no)
    qk_norm: bool             # RMSNorm over head_dim on q and k before RoPE (Qwen3)
    eos_token_ids: tuple = ()
    torch_dtype: str = ""
    rope_scaling: RopeScaling = RopeScaling()
    # Mixture of experts (Qwen2-MoE, Qwen3-MoE): in each layer of moe_layers the MLP is num_experts
    # MLPs of moe_intermediate_size, of which a router picks num_experts_per_tok per token; Qwen2-MoE
    # adds a shared expert of shared_expert_intermediate_size that every token runs, scaled by a
    # sigmoid gate
    shared_expert_intermediate_size: int = 0
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False  # the picked experts' weights renormalised to sum to 1
    moe_layers: tuple = ()

    @property
    def q_size(self):
        return self.num_heads * self.head_dim

    @property
    def kv_size(self):
        return self.num_kv_heads * self.head_dim

    @property
    def context_length(self) -> int:
        """Positions the model is meant to read: its trained context, stretched by RoPE scaling
        (YaRN's original context times its factor, as vLLM counts it)."""
        rs, n = self.rope_scaling, self.max_position_embeddings
        if rs.kind == "yarn":
            n = max(n, int(rs.original_max_position_embeddings * rs.factor))
        elif rs.kind == "linear":
            n = int(n * rs.factor)
        return max(1, min(n, (1 << 31) - 1))


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# Far past any real model (Qwen2.5-72B: hidden 8192, 80 layers, 152k vocab), far below sizes whose
# products overflow the kernels' 64-bit index arithmetic.
MAX_DIM = 1 << 24


class _Reader:
    """Typed access to a config dict: every value is checked for its type and range, and a bad one
    is a ConfigError naming the file and the key."""

    def __init__(self, cfg: dict, source: str):
        self.cfg, self.source = cfg, source

    def error(self, msg):
        return ConfigError(f"{self.source}: {msg}")

    def _value(self, key, default):
        """The value of `key`; `default` when it is absent or null, required when that is None."""
        v = self.cfg.get(key)
        if v is None:
            if default is None:
                raise self.error(f"missing '{key}'")
            return default
        return v

    def int(self, key, default=None, lo=1, hi=MAX_DIM):
        v = self._value(key, default)
        if isinstance(v, float) and v.is_integer():
            v = int(v)  # JSON writers sometimes emit 64.0
        if not _is_int(v) or not lo <= v <= hi:
            raise self.error(f"'{key}' must be an integer in [{lo}, {hi}], got {v!r}"[:300])
        return v

    def float(self, key, default=None, positive=False):
        v = self._value(key, default)
        # float32 range: the model computes in float32
        if not _is_number(v) or not math.isfinite(v) or v < 0 or (positive and v == 0) or v > 3.4e38:
            need = "> 0" if positive else ">= 0"
            raise self.error(f"'{key}' must be a finite float32 {need}, got {v!r}"[:300])
        return float(v)

    def bool(self, key, default):
        v = self._value(key, default)
        if not isinstance(v, bool):
            raise self.error(f"'{key}' must be true or false, got {v!r}"[:300])
        return v

    def dict(self, key):
        v = self.cfg.get(key)
        if v is None:
            return {}
        if not isinstance(v, dict):
            raise self.error(f"'{key}' must be an object, got {v!r}"[:300])
        return v


def _rope_block(r: _Reader) -> tuple:
    """The config's RoPE settings, (kind, block): transformers 5's `rope_parameters` or
    transformers 4's `rope_scaling`, whichever names a scaling type (both may not)."""
    params, scaling = r.dict("rope_parameters"), r.dict("rope_scaling")
    kinds = [_rope_kind(r, b) for b in (params, scaling)]
    if kinds[0] != "default" and kinds[1] != "default" and kinds[0] != kinds[1]:
        raise r.error(f"rope_parameters ({kinds[0]!r}) and rope_scaling ({kinds[1]!r}) disagree")
    if kinds[0] == "default" and kinds[1] != "default":
        return kinds[1], scaling
    return kinds[0], params


def _rope_kind(r: _Reader, block: dict) -> str:
    kind = block.get("rope_type", block.get("type", "default"))
    kind = "default" if kind is None else kind
    if kind not in ("default", "linear", "yarn"):
        raise r.error(f"rope type {kind!r} is not supported (RoPE scaling: 'linear' and 'yarn' are)"[:300])
    return kind


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _rope(r: _Reader) -> tuple:
    """theta and the RoPE scaling, in either config layout, computed as transformers does."""
    kind, block = _rope_block(r)
    params = r.dict("rope_parameters")
    if params.get("rope_theta") is not None:
        theta = _Reader(params, f"{r.source} (rope_parameters)").float("rope_theta", positive=True)
    elif r.cfg.get("rope_theta") is None:
        raise r.error("no rope_theta (top-level or under rope_parameters)")
    else:
        theta = r.float("rope_theta", positive=True)
    if theta < 1:  # the frequencies theta ** (-2i / d) would grow past float32 instead of falling
        raise r.error(f"'rope_theta' must be >= 1, got {theta!r}")
    if kind == "default":
        return theta, RopeScaling()
    b = _Reader(block, f"{r.source} (rope scaling)")
    if block.get("partial_rotary_factor", 1.0) != 1.0 or r.cfg.get("partial_rotary_factor", 1.0) not in (1.0, None):
        raise r.error("partial_rotary_factor is not supported")
    max_pos = r.int("max_position_embeddings", default=32768, hi=(1 << 31) - 1)
    if kind == "linear":
        return theta, RopeScaling("linear", factor=b.float("factor", positive=True))
    if theta == 1:  # the ramp's bounds divide by log(theta)
        raise r.error("YaRN needs rope_theta > 1")
    original = b.int("original_max_position_embeddings", default=max_pos, hi=(1 << 31) - 1)
    # transformers: a missing factor is the ratio of the two contexts
    factor = b.float("factor", default=max_pos / original, positive=True)
    if block.get("attention_factor") is not None:
        attention = b.float("attention_factor", positive=True)
    else:
        mscale, mscale_all = b.float("mscale", default=0.0), b.float("mscale_all_dim", default=0.0)
        if mscale and mscale_all:
            attention = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
        else:
            attention = _yarn_mscale(factor)
    # transformers reads a zero beta as its default (`or`)
    beta_fast, beta_slow = b.float("beta_fast", default=0.0) or 32.0, b.float("beta_slow", default=0.0) or 1.0
    return theta, RopeScaling("yarn", factor=factor, original_max_position_embeddings=original,
                              attention_factor=attention, beta_fast=beta_fast, beta_slow=beta_slow,
                              truncate=b.bool("truncate", True))


def _eos_ids(r: _Reader) -> tuple:
    value = r.cfg.get("eos_token_id")
    if value is None:
        return ()
    ids = value if isinstance(value, list) else [value]
    if not all(_is_int(i) and 0 <= i < 2**31 for i in ids):
        raise r.error(f"'eos_token_id' must be a token id or a list of them, got {value!r}"[:300])
    return tuple(ids)


def config_from_dict(cfg: dict, source: str = "config.json") -> ModelConfig:
    if not isinstance(cfg, dict):
        raise ConfigError(f"{source}: expected a JSON object, got {type(cfg).__name__}")
    r = _Reader(cfg, source)
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise r.error(f"'architectures' must be a list of names, got {archs!r}"[:300])
    arch = next((ARCHITECTURES[a] for a in archs if a in ARCHITECTURES), None)
    if arch is None:
        model_type = cfg.get("model_type")
        arch = model_type if model_type in ARCHITECTURES.values() else None
    if arch is None:
        raise ConfigError(f"{source}: unsupported architecture {archs or cfg.get('model_type')!r}; "
                          f"supported: {', '.join(ARCHITECTURES)}"[:400])
    if cfg.get("use_sliding_window"):
        raise ConfigError(f"{source}: use_sliding_window is on; sliding-window attention is not supported")

    hidden = r.int("hidden_size")
    theta, rope_scaling = _rope(r)
    heads = r.int("num_attention_heads")
    kv_heads = r.int("num_key_value_heads", default=heads)
    head_dim = r.int("head_dim", default=hidden // heads)
    if heads % kv_heads:
        raise ConfigError(f"{source}: {heads} attention heads do not divide into {kv_heads} kv heads")
    if heads // kv_heads > 64:  # the attention kernel's limit (csrc/attention.c)
        raise ConfigError(f"{source}: {heads // kv_heads} query heads per kv head; at most 64 are supported")
    if head_dim % 2:
        raise ConfigError(f"{source}: head_dim {head_dim} must be even for RoPE")
    num_layers = r.int("num_hidden_layers", hi=1 << 16)
    return ModelConfig(
        arch=arch,
        hidden_size=hidden,
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=r.int("intermediate_size"),
        vocab_size=r.int("vocab_size", hi=(1 << 31) - 1),
        rms_norm_eps=r.float("rms_norm_eps", default=1e-6),
        rope_theta=theta,
        max_position_embeddings=r.int("max_position_embeddings", default=32768, hi=(1 << 31) - 1),
        tie_word_embeddings=r.bool("tie_word_embeddings", False),
        attention_bias=r.bool("qkv_bias" if arch == "qwen2_moe" else "attention_bias", arch in ("qwen2", "qwen2_moe")),
        qk_norm=arch in ("qwen3", "qwen3_moe"),
        eos_token_ids=_eos_ids(r),
        torch_dtype=str(cfg.get("dtype") or cfg.get("torch_dtype") or "")[:64],
        rope_scaling=rope_scaling,
        **(_experts(r, arch, num_layers) if arch.endswith("_moe") else {}),
    )


def _experts(r: _Reader, arch: str, num_layers: int) -> dict:
    """The expert settings; which layers have experts, as transformers decides it."""
    key = "num_experts" if r.cfg.get("num_experts") is not None else "num_local_experts"
    n = r.int(key, hi=1 << 16)
    top_k = r.int("num_experts_per_tok", hi=n)
    step = r.int("decoder_sparse_step", default=1, hi=1 << 16)
    dense = r.cfg.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(_is_int(i) for i in dense):
        raise r.error(f"'mlp_only_layers' must be a list of layer numbers, got {dense!r}"[:300])
    dense = set(dense)
    # Qwen3-MoE has no shared expert (transformers' config has no such field)
    shared = r.int("shared_expert_intermediate_size") if arch == "qwen2_moe" else 0
    return dict(shared_expert_intermediate_size=shared, num_experts=n, num_experts_per_tok=top_k, moe_intermediate_size=r.int("moe_intermediate_size"),
                norm_topk_prob=r.bool("norm_topk_prob", False),
                moe_layers=tuple(i for i in range(num_layers) if (i + 1) % step == 0 and i not in dense))


def with_rope_scaling(cfg: ModelConfig, scaling: dict, source: str = "rope_scaling") -> ModelConfig:
    """cfg with the RoPE scaling a user asks for in place of the file's: `scaling` read as a
    config.json's `rope_scaling` is ({"type": "yarn", "factor": 4.0, ...}; {} or type "default"
    for none), against the file's theta and context."""
    if not isinstance(scaling, dict):
        raise ConfigError(f"{source}: expected an object like {{\"type\": \"yarn\", \"factor\": 4.0}}, "
                          f"got {scaling!r}"[:300])
    r = _Reader({"rope_theta": cfg.rope_theta, "max_position_embeddings": cfg.max_position_embeddings,
                 "rope_scaling": scaling}, source)
    return dataclasses.replace(cfg, rope_scaling=_rope(r)[1])


def load_config(model_dir) -> ModelConfig:
    path = Path(model_dir) / "config.json"
    if not path.exists():
        raise ConfigError(f"{path}: not found (a model directory needs config.json)")
    return config_from_dict(read_json(path, ConfigError, max_bytes=1 << 20), str(path))
