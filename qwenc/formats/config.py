"""Model hyper-parameters, read from a HuggingFace config.json (transformers 4 or 5 layout).

Everything the forward pass needs is here, validated once at load, so that the model code can
trust it. Settings we do not implement (RoPE scaling, sliding window) are refused, not ignored:
ignoring them would give a model that talks, but wrongly.
"""
import json
from dataclasses import dataclass
from pathlib import Path

ARCHITECTURES = {"Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}


from ..errors import ConfigError


@dataclass(frozen=True)
class ModelConfig:
    arch: str                 # "qwen2" (q/k/v biases) or "qwen3" (q/k RMSNorm per head)
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

    @property
    def q_size(self):
        return self.num_heads * self.head_dim

    @property
    def kv_size(self):
        return self.num_kv_heads * self.head_dim


def _rope_theta(cfg: dict, source: str) -> float:
    """theta and a refusal of scaled RoPE, in either config layout."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    for block in (params, scaling):
        kind = block.get("rope_type", block.get("type", "default"))
        if kind not in (None, "default"):
            raise ConfigError(f"{source}: rope type '{kind}' (RoPE scaling/YaRN) is not supported")
    theta = params.get("rope_theta", cfg.get("rope_theta"))
    if theta is None:
        raise ConfigError(f"{source}: no rope_theta (top-level or under rope_parameters)")
    return float(theta)


def _eos_ids(value) -> tuple:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def config_from_dict(cfg: dict, source: str = "config.json") -> ModelConfig:
    archs = cfg.get("architectures") or []
    arch = next((ARCHITECTURES[a] for a in archs if a in ARCHITECTURES), None)
    if arch is None:
        arch = {"qwen2": "qwen2", "qwen3": "qwen3"}.get(cfg.get("model_type"))
    if arch is None:
        raise ConfigError(f"{source}: unsupported architecture {archs or cfg.get('model_type')}; "
                          f"supported: {', '.join(ARCHITECTURES)}")
    if cfg.get("use_sliding_window"):
        raise ConfigError(f"{source}: use_sliding_window is on; sliding-window attention is not supported")

    def need(key):
        if key not in cfg:
            raise ConfigError(f"{source}: missing '{key}'")
        return cfg[key]

    hidden = int(need("hidden_size"))
    heads = int(need("num_attention_heads"))
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    if heads % kv_heads:
        raise ConfigError(f"{source}: {heads} attention heads do not divide into {kv_heads} kv heads")
    if head_dim % 2:
        raise ConfigError(f"{source}: head_dim {head_dim} must be even for RoPE")
    return ModelConfig(
        arch=arch,
        hidden_size=hidden,
        num_layers=int(need("num_hidden_layers")),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=int(need("intermediate_size")),
        vocab_size=int(need("vocab_size")),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(cfg, source),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", arch == "qwen2")),
        qk_norm=arch == "qwen3",
        eos_token_ids=_eos_ids(cfg.get("eos_token_id")),
        torch_dtype=str(cfg.get("dtype") or cfg.get("torch_dtype") or ""),
    )


def load_config(model_dir) -> ModelConfig:
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: not found (a model directory needs config.json)") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    return config_from_dict(cfg, str(path))
