"""Random-weight Qwen models built with transformers' own classes, as test oracles.

transformers' default init gives near-uniform logits, where greedy decoding sits on ties and
bias or norm bugs hide; so every weight is overwritten from a seeded generator with spread-out
scales. The saved file (F32, BF16 or F16, optionally sharded) and the returned float32 torch model
hold the same numbers: for 16-bit files the torch model gets the rounded weights back.
"""
import copy
import json
from pathlib import Path

import torch
from transformers import (Qwen2Config, Qwen2ForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def _fill(model, seed, qk_bias_scale=0.1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif name.endswith("bias"):
                scale = qk_bias_scale if ("q_proj" in name or "k_proj" in name) else 0.1
                p.copy_(torch.randn(p.shape, generator=g) * scale)
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            else:
                fan_in = p.shape[-1]  # stacked experts: [experts, out, in]
                big = "o_proj" in name or "down_proj" in name
                p.copy_(torch.randn(p.shape, generator=g) * ((16.0 if big else 1.0) / fan_in) ** 0.5)


def make_model(out_dir, arch="qwen2", dtype="f32", seed=0, shard_size=None, qk_bias_scale=0.1, **overrides):
    """Save a random model to out_dir; return (out_dir, float32 torch model with equal weights)."""
    base = dict(vocab_size=384, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
    base.update(overrides)
    if arch == "qwen2":
        cfg, cls = Qwen2Config(**base), Qwen2ForCausalLM
    elif arch == "qwen3_moe":
        moe = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True)
        cfg, cls = Qwen3MoeConfig(**{**moe, **base}), Qwen3MoeForCausalLM
    elif arch == "qwen2_moe":
        moe = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=96,
                   norm_topk_prob=False)
        cfg, cls = Qwen2MoeConfig(**{**moe, **base}), Qwen2MoeForCausalLM
    else:
        cfg, cls = Qwen3Config(**base), Qwen3ForCausalLM
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    _fill(model, seed + 1, qk_bias_scale)
    # Round the parameters (only: the RoPE inv_freq buffer must stay float32) to the file's
    # precision, so that the file and the float32 reference hold the same values.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(TORCH_DTYPES[dtype]).float())
    out_dir = Path(out_dir)
    kwargs = {"max_shard_size": shard_size} if shard_size else {}
    copy.deepcopy(model).to(TORCH_DTYPES[dtype]).save_pretrained(out_dir, **kwargs)
    return out_dir, model


def to_transformers4_layout(model_dir):
    """Rewrite config.json the way transformers 4 wrote it (rope_theta top-level, RoPE scaling as
    `rope_scaling` with its "type", torch_dtype)."""
    path = Path(model_dir) / "config.json"
    cfg = json.loads(path.read_text())
    params = dict(cfg.pop("rope_parameters", None) or {})
    if "rope_theta" in params:
        cfg["rope_theta"] = params.pop("rope_theta")
    kind = params.pop("rope_type", "default")
    if kind != "default":
        cfg["rope_scaling"] = {"type": kind, **params}
    if "dtype" in cfg:
        cfg["torch_dtype"] = cfg.pop("dtype")
    path.write_text(json.dumps(cfg, indent=2))
