"""Small random-weight Qwen2 models with a working tokenizer, stored the ways users meet them: a
HuggingFace directory, GGUF files of several storage types, a GGUF split over several files.

The GGUF files are written with the gguf package's own writer (its split mode for split files),
from the directory's float32 weights, under tensor names written out here rather than taken from
qwenc.formats.gguf, so that a wrong mapping there cannot cancel itself out.
"""
import json
from pathlib import Path

import numpy as np

from modelgen import make_model
from oracles import qwen2_pipeline

ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("h", "e"), ("l", "l"), ("he", "ll"), ("Ġ", "t")]
N_VOCAB = 256 + len(MERGES) + len(ADDED)


def tokenizer():
    """A byte-level BPE in Qwen's pipeline (NFC, Qwen2 split, ByteLevel) with a 263-token vocab
    plus 3 special tokens, so it fits the 384-row random models and the text paths run on it."""
    from tokenizers import AddedToken, pre_tokenizers
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {t: i for i, t in enumerate(alphabet + [a + b for a, b in MERGES])}
    tok = qwen2_pipeline(vocab, MERGES)
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in ADDED])
    return tok, vocab


def make_tiny(out_dir, seed=5, arch="qwen2", **overrides):
    """A random qwen2 (or qwen3_moe) model directory (float32) with tokenizer.json and
    tokenizer_config.json."""
    model_dir, _ = make_model(out_dir, arch=arch, dtype="f32", seed=seed, **overrides)
    tok, _ = tokenizer()
    tok.save(str(Path(model_dir) / "tokenizer.json"))
    (Path(model_dir) / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    return Path(model_dir)


_GGUF_BLOCK = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
               "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
               "mlp.gate": "ffn_gate_inp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
               "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
               "mlp.shared_expert.down_proj": "ffn_down_shexp"}
_GGUF_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}

# storage type -> (general.file_type, how a 2-D weight is stored)
STORAGE = {"F32": 0, "F16": 1, "Q8_0": 7, "Q4_0": 2, "Q4_K_M": 15}


def gguf_name(hf):
    if hf in _GGUF_TOP:
        return _GGUF_TOP[hf]
    _, _, layer, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_GGUF_BLOCK[module]}.{kind}"


def _random_q4_k(rows, cols, rng):
    """Valid Q4_K blocks of random content (gguf's writer cannot quantize to K blocks): per 256
    values an f16 scale and min, 12 bytes of 6-bit sub-block scales and mins, 128 bytes of nibbles."""
    import gguf
    nblocks = rows * cols // 256
    blocks = rng.integers(0, 256, size=(nblocks, 144), dtype=np.uint8)
    blocks[:, 0:2] = np.frombuffer(np.float16(0.004).tobytes(), np.uint8)   # d
    blocks[:, 2:4] = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)   # dmin
    out = blocks.reshape(rows, cols // 256 * 144)
    assert np.isfinite(gguf.quants.dequantize(out, gguf.GGMLQuantizationType.Q4_K)).all()
    return out


def _stored(name, arr, storage, rng):
    """(data, raw_dtype) for one tensor: 1-D tensors (norms, biases) stay float32."""
    import gguf
    T = gguf.GGMLQuantizationType
    if arr.ndim == 1 or storage == "F32" or "ffn_gate_inp" in name:  # llama.cpp keeps routers F32
        return arr, None
    if storage == "F16":
        return arr.astype(np.float16), None
    if storage in ("Q8_0", "Q4_0"):
        return gguf.quants.quantize(arr, T[storage]), T[storage]
    if storage == "Q4_K_M":  # as llama.cpp's mix: Q8_0 for the embedding and output, Q4_K elsewhere
        if name in ("token_embd.weight", "output.weight"):
            return gguf.quants.quantize(arr, T.Q8_0), T.Q8_0
        return _random_q4_k(arr.shape[0], arr.shape[1], rng), T.Q4_K
    raise ValueError(storage)


def write_gguf(model_dir: Path, path: Path, storage="F32", split_max_tensors=0, seed=0):
    """The directory's model, config and tokenizer as a qwen2 GGUF with 2-D weights stored as
    `storage`; split into files of at most `split_max_tensors` tensors when that is set (then the
    files are PATH-00001-of-0000N.gguf ... and the first is returned)."""
    import gguf
    from safetensors.numpy import load_file
    _, vocab = tokenizer()
    rng = np.random.default_rng(seed)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((model_dir / "config.json").read_text())
    theta = cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]
    arch = {"Qwen3MoeForCausalLM": "qwen3moe", "Qwen2MoeForCausalLM": "qwen2moe"}.get(cfg["architectures"][0], "qwen2")
    w = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    if arch == "qwen2moe":
        w.add_uint32("qwen2moe.expert_shared_feed_forward_length", cfg["shared_expert_intermediate_size"])
    if arch in ("qwen2moe", "qwen3moe"):
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_expert_count(cfg.get("num_experts") or cfg["num_local_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(theta)
    rope = cfg.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":  # the keys llama.cpp's converter writes
        w.add_rope_scaling_type(gguf.RopeScalingType(rope["rope_type"]))
        w.add_rope_scaling_factor(rope["factor"])
        if "original_max_position_embeddings" in rope:
            w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        if "beta_fast" in rope:
            w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        if "beta_slow" in rope:
            w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_file_type(STORAGE[storage])
    tokens = sorted(vocab, key=vocab.get) + ADDED
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * len(vocab) + [3] * len(ADDED))  # normal, then control
    w.add_token_merges([f"{a} {b}" for a, b in MERGES])
    w.add_eos_token_id(len(vocab) + ADDED.index("<|im_end|>"))
    tensors = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    stacked = {}  # experts' matrices, one 3-D tensor per layer and kind, as llama.cpp stores them
    for name in sorted(tensors):
        parts = name.split(".")
        if len(parts) == 8 and parts[4] == "experts":
            stacked.setdefault(f"blk.{parts[2]}.ffn_{parts[6][:-5]}_exps.weight", []).append((int(parts[5]), name))
    experts = {n for group in stacked.values() for _, n in group}
    # llama.cpp stores Qwen2-MoE's shared-expert gate [1, hidden] as a vector
    items = [(gguf_name(n), arr.reshape(-1) if n.endswith("shared_expert_gate.weight") else arr)
             for n, arr in tensors.items() if n not in experts]
    items += [(g, np.stack([tensors[n] for _, n in sorted(group)])) for g, group in stacked.items()]
    for name, arr in items:
        assert arr.dtype == np.float32, name
        data, raw = _stored(name, arr, storage, rng)
        w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if split_max_tensors:
        parts = sorted(Path(path).parent.glob(Path(path).stem + "-*-of-*.gguf"))
        assert len(parts) > 1, parts
        return parts[0]
    return Path(path)
