"""Parity with transformers' own Qwen2/Qwen3 classes on seeded random-weight models.

Each case covers a different corner: attention biases, tied and untied heads, GQA ratios 1, 2, 3
and 4, Qwen3's head_dim != hidden / heads, F32/BF16/F16 files, sharded checkpoints, RoPE scaling
(YaRN, linear), Qwen3-MoE's experts, and one with large q/k biases (as real Qwen2 checkpoints have) whose attention scores exceed exp()'s float32
range unless the softmax subtracts the max. The falsifiers at the end swap in deliberately broken
kernels and show that the same checks then fail.
"""
import numpy as np
import pytest
import torch

import qwenc
from qwenc import _ops
from modelgen import make_model, to_transformers4_layout

TOL = 1e-4

CASES = {
    "qwen2-bias-untied-gqa2-f32": dict(arch="qwen2", dtype="f32"),
    "qwen2-tied-mha-bf16": dict(arch="qwen2", dtype="bf16", tie_word_embeddings=True, num_key_value_heads=4),
    "qwen2-gqa4-f16-sharded-bigqk": dict(arch="qwen2", dtype="f16", num_attention_heads=8, num_key_value_heads=2,
                                         shard_size="60KB", qk_bias_scale=8.0),
    "qwen3-headdim-gqa3-f32": dict(arch="qwen3", dtype="f32", hidden_size=48, num_attention_heads=6,
                                   num_key_value_heads=2, head_dim=32),
    "qwen3-tied-gqa4-bf16-sharded": dict(arch="qwen3", dtype="bf16", tie_word_embeddings=True, hidden_size=64,
                                         num_attention_heads=8, num_key_value_heads=2, head_dim=24,
                                         shard_size="80KB", num_hidden_layers=3),
    # RoPE scaling: YaRN as Qwen's model cards prescribe it (an original context shorter than the
    # prompts, so that the ramp and the attention factor both matter), with its optional knobs,
    # and linear
    "qwen2-yarn-f32": dict(arch="qwen2", dtype="f32", rope_parameters=dict(
        rope_type="yarn", factor=4.0, original_max_position_embeddings=32, rope_theta=10000.0)),
    "qwen3-yarn-mscale-bf16": dict(arch="qwen3", dtype="bf16", hidden_size=48, num_attention_heads=6,
                                   num_key_value_heads=2, head_dim=32, rope_parameters=dict(
        rope_type="yarn", factor=8.0, original_max_position_embeddings=24, mscale=0.7, mscale_all_dim=1.0,
        beta_fast=16.0, beta_slow=2.0, truncate=False, rope_theta=500.0)),
    "qwen2-linear-f32": dict(arch="qwen2", dtype="f32", rope_parameters=dict(
        rope_type="linear", factor=3.0, rope_theta=10000.0)),
    # Qwen3-MoE: 8 experts, 2 a token, renormalised; then 3 of 8 not renormalised, with a dense
    # layer among the expert layers (mlp_only_layers) and GQA 3
    "qwen3moe-top2-f32": dict(arch="qwen3_moe", dtype="f32"),
    "qwen3moe-top3-dense-layer-bf16": dict(arch="qwen3_moe", dtype="bf16", num_hidden_layers=3, mlp_only_layers=[1],
                                           num_experts_per_tok=3, norm_topk_prob=False, hidden_size=48,
                                           num_attention_heads=6, num_key_value_heads=2, head_dim=32),
    # Qwen2-MoE: q/k/v biases, top-2 of 8 not renormalised, and a shared expert behind a sigmoid
    # gate; then top-3 renormalised with the first layer dense
    "qwen2moe-shared-f32": dict(arch="qwen2_moe", dtype="f32"),
    "qwen2moe-top3-dense-first-bf16": dict(arch="qwen2_moe", dtype="bf16", num_experts_per_tok=3,
                                           norm_topk_prob=True, mlp_only_layers=[0], num_hidden_layers=3),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    spec = dict(CASES[request.param])
    path, ref = make_model(tmp_path_factory.mktemp(request.param), seed=len(request.param), **spec)
    return request.param, path, ref


def prompt(n=40, vocab=384, seed=7):
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


def ref_logits(ref, ids):
    with torch.no_grad():
        return ref(torch.tensor([ids])).logits[0].float().numpy()


def ref_greedy(ref, ids, n):
    with torch.no_grad():
        out = ref.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                           max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
    return out[0, len(ids):].tolist()


def assert_greedy_matches(ref, ids, ours, theirs, tol=TOL):
    """Identical, or diverging only right after a near-tie of the reference's top two logits."""
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            row = np.sort(ref_logits(ref, ids + theirs[:i])[-1])
            gap = row[-1] - row[-2]
            assert gap < tol, f"greedy diverged at step {i} ({a} vs {b}) with top-2 gap {gap}"
            return
    assert ours == theirs


# ---------------------------------------------------------------- parity

def test_logits_every_position(case):
    name, path, ref = case
    model = qwenc.load(path)
    ids = prompt()
    ours = model.logits(ids, all_positions=True)
    theirs = ref_logits(ref, ids)
    assert ours.shape == theirs.shape and ours.dtype == np.float32
    err = np.abs(ours - theirs).max()
    assert err < TOL, f"{name}: max |logit diff| {err}"
    np.testing.assert_allclose(model.logits(ids), theirs[-1], atol=TOL, rtol=0)


def test_greedy_32_tokens(case):
    name, path, ref = case
    model = qwenc.load(path)
    ids = prompt(12, seed=3)
    ours = list(model.generate_tokens(ids, max_tokens=32, temperature=0, stop_token_ids=[]))
    theirs = ref_greedy(ref, ids, 32)
    assert len(ours) == 32
    assert_greedy_matches(ref, ids, ours, theirs)


def test_kv_cache_decode_equals_recompute(case):
    name, path, ref = case
    model = qwenc.load(path, context=64)
    ids = prompt(50, seed=11)
    full = model.logits(ids, all_positions=True)
    seq = model.new_sequence()
    steps = [model.forward(seq, ids[:20])]
    for t in ids[20:]:
        steps.append(model.forward(seq, [t]))
    np.testing.assert_allclose(np.stack(steps[:-1]), full[19:-1], atol=TOL, rtol=0)
    np.testing.assert_allclose(steps[-1], full[-1], atol=TOL, rtol=0)
    assert len(seq) == 50


def test_batched_decode_equals_one_by_one(case):
    name, path, ref = case
    model = qwenc.load(path, context=64)
    prompts = [prompt(n, seed=n) for n in (5, 9, 17)]
    seqs = [model.new_sequence() for _ in prompts]
    for s, p in zip(seqs, prompts):
        model.forward(s, p[:-1])
    batched = model.decode_batch(seqs, [p[-1] for p in prompts])
    for row, p in zip(batched, prompts):
        np.testing.assert_allclose(row, model.logits(p), atol=1e-5, rtol=0)


def test_threads_and_plain_path_agree(case):
    name, path, ref = case
    ids = prompt(30, seed=5)
    theirs = ref_logits(ref, ids)
    one = qwenc.load(path, threads=1).logits(ids, all_positions=True)
    two = qwenc.load(path, threads=2).logits(ids, all_positions=True)
    np.testing.assert_allclose(one, two, atol=1e-5, rtol=0)
    old = _ops.set_simd(False)
    try:
        plain = qwenc.load(path).logits(ids, all_positions=True)
    finally:
        _ops.set_simd(old)
    assert np.abs(plain - theirs).max() < TOL


def test_transformers4_config_layout(case, tmp_path):
    import shutil
    name, path, ref = case
    copy = tmp_path / "t4"
    shutil.copytree(path, copy)
    to_transformers4_layout(copy)
    ids = prompt(10)
    np.testing.assert_array_equal(qwenc.load(copy).logits(ids), qwenc.load(path).logits(ids))


# ---------------------------------------------------------------- falsifiers

class BrokenOps:
    """_ops with one kernel replaced by a numpy version; everything else passes through."""

    def __init__(self, **replacements):
        self.replacements = replacements

    def __getattr__(self, name):
        return self.replacements.get(name) or getattr(_ops, name)


def rope_adjacent(x, pos, inv_freq, mscale=1.0):
    """Wrong: pairs neighbours (2i, 2i+1), the GPT-J layout, instead of i and i + hd/2."""
    ang = pos[:, None].astype(np.float32) * inv_freq[None, :]
    c, s = np.cos(ang)[:, None, :] * mscale, np.sin(ang)[:, None, :] * mscale
    a, b = x[..., 0::2].copy(), x[..., 1::2].copy()
    x[..., 0::2] = a * c - b * s
    x[..., 1::2] = b * c + a * s


def numpy_attention(kv_head_of, subtract_max=True):
    """paged_attention in numpy: gathers each row's keys and values through its block table."""
    def paged_attention(q, Kc, Vc, tables, row_seq, row_pos, scale, out):
        T, H, hd = q.shape
        Hkv, bs = Vc.shape[0], Vc.shape[2]
        for t in range(T):
            n = int(row_pos[t]) + 1
            blocks = tables[row_seq[t], :-(-n // bs)]
            K = Kc[:, blocks].transpose(0, 1, 3, 2).reshape(Hkv, -1, hd)[:, :n].astype(np.float32)
            V = Vc[:, blocks].reshape(Hkv, -1, hd)[:, :n].astype(np.float32)
            for h in range(H):
                kvh = kv_head_of(h, H, Hkv)
                s = (K[kvh] @ q[t, h]) * np.float32(scale)
                if subtract_max:
                    s = s - s.max()
                with np.errstate(over="ignore", invalid="ignore"):
                    e = np.exp(s)
                    out[t, h] = (e / e.sum()) @ V[kvh]
    return paged_attention


def gqa_div(h, H, Hkv):
    return h // (H // Hkv)


def gqa_mod(h, H, Hkv):
    return h % Hkv


def parity_error(path, ref, monkeypatch, ops=None, drop_qk_norm=False):
    import qwenc.model.forward
    if ops is not None:
        monkeypatch.setattr(qwenc.model.forward, "_ops", ops)
    model = qwenc.load(path)
    if ops is not None:
        # the replaced kernel is called from the per-layer Python path; the one-call C path
        # (the default, which the other tests check) is held equal to it by test_forward_fused.py
        model.transformer.fused = False
    if drop_qk_norm:
        for layer in model.weights.layers:
            layer.q_norm = layer.k_norm = None
    ids = prompt(24)
    ours = model.logits(ids, all_positions=True)
    err = np.abs(ours - ref_logits(ref, ids)).max()
    return err if np.isfinite(err) else np.inf


def test_reference_numpy_attention_passes(tmp_path, monkeypatch):
    """The falsifiers' own machinery is sound: a correct numpy attention passes the check."""
    path, ref = make_model(tmp_path, **{k: v for k, v in CASES["qwen2-gqa4-f16-sharded-bigqk"].items()})
    err = parity_error(path, ref, monkeypatch, BrokenOps(paged_attention=numpy_attention(gqa_div)))
    assert err < TOL


@pytest.mark.parametrize("name", ["qwen2-bias-untied-gqa2-f32", "qwen3-headdim-gqa3-f32"])
def test_falsifier_adjacent_rope_fails(name, tmp_path, monkeypatch):
    path, ref = make_model(tmp_path, **CASES[name])
    assert parity_error(path, ref, monkeypatch, BrokenOps(rope=rope_adjacent)) > TOL * 10


@pytest.mark.parametrize("name", ["qwen2-gqa4-f16-sharded-bigqk", "qwen3-headdim-gqa3-f32"])
def test_falsifier_modulo_gqa_fails(name, tmp_path, monkeypatch):
    path, ref = make_model(tmp_path, **CASES[name])
    assert parity_error(path, ref, monkeypatch, BrokenOps(paged_attention=numpy_attention(gqa_mod))) > TOL * 10


def test_falsifier_missing_qk_norm_fails(tmp_path, monkeypatch):
    path, ref = make_model(tmp_path, **CASES["qwen3-headdim-gqa3-f32"])
    assert parity_error(path, ref, monkeypatch, drop_qk_norm=True) > TOL * 10


def test_falsifier_softmax_without_max_fails(tmp_path, monkeypatch):
    path, ref = make_model(tmp_path, **CASES["qwen2-gqa4-f16-sharded-bigqk"])
    broken = BrokenOps(paged_attention=numpy_attention(gqa_div, subtract_max=False))
    assert parity_error(path, ref, monkeypatch, broken) > TOL * 10


def _rope_without(part):
    """rope_frequencies with one part of YaRN left out: its stretched frequencies ("freqs") or its
    cos/sin scale ("mscale")."""
    import dataclasses
    from qwenc.formats.config import RopeScaling
    from qwenc.model.rope import rope_frequencies

    def broken(cfg):
        inv_freq, mscale = rope_frequencies(cfg)
        if part == "mscale":
            return inv_freq, 1.0
        return rope_frequencies(dataclasses.replace(cfg, rope_scaling=RopeScaling()))[0], mscale
    return broken


@pytest.mark.parametrize("part", ["freqs", "mscale"])
@pytest.mark.parametrize("name", ["qwen2-yarn-f32", "qwen3-yarn-mscale-bf16"])
def test_falsifier_yarn_in_part_fails(name, part, tmp_path, monkeypatch):
    import qwenc.model.forward
    path, ref = make_model(tmp_path, **CASES[name])
    monkeypatch.setattr(qwenc.model.forward, "rope_frequencies", _rope_without(part))
    assert parity_error(path, ref, monkeypatch) > TOL * 10


@pytest.mark.parametrize("arch,rope,theta,head_dim,max_pos", [
    # Qwen2.5's model cards: add this to config.json for inputs past 32,768 tokens
    ("qwen2", {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, 1e6, 128, 32768),
    # Qwen3's, in transformers 5's layout
    ("qwen3", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, 1e6, 128, 40960),
    ("qwen2", {"type": "yarn", "factor": 2.0}, 1e6, 64, 32768),  # the original context defaults to the model's
    ("qwen3", {"rope_type": "linear", "factor": 2.5}, 5e5, 96, 8192),
])
def test_rope_scaling_of_real_shapes_equals_transformers(arch, rope, theta, head_dim, max_pos):
    """The frequencies and cos/sin scale of real models' shapes, those transformers computes (to
    an ulp), and the context a server then offers (YaRN: the original context times the factor,
    as vLLM counts it)."""
    from transformers import Qwen2Config, Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from qwenc.formats.config import config_from_dict
    from qwenc.model.rope import rope_frequencies
    cls = Qwen2Config if arch == "qwen2" else Qwen3Config
    key = "rope_scaling" if "type" in rope else "rope_parameters"
    raw = dict(architectures=[arch.capitalize() + "ForCausalLM"], hidden_size=16 * head_dim, num_attention_heads=16,
               num_key_value_heads=2, head_dim=head_dim, intermediate_size=64, vocab_size=100,
               num_hidden_layers=1, max_position_embeddings=max_pos, rope_theta=theta, **{key: dict(rope)})
    theirs_cfg = cls(**{k: v for k, v in raw.items() if k != "architectures"})
    kind = rope.get("rope_type", rope.get("type"))
    inv_freq, scale = ROPE_INIT_FUNCTIONS[kind](theirs_cfg, "cpu")
    cfg = config_from_dict(raw)
    ours, mscale = rope_frequencies(cfg)
    # torch's float32 power is not always correctly rounded: an ulp apart at most
    np.testing.assert_array_max_ulp(ours, inv_freq.numpy(), maxulp=1)
    assert np.float32(mscale) == np.float32(scale)
    if kind == "yarn":
        original = rope.get("original_max_position_embeddings", max_pos)
        assert cfg.context_length == max(max_pos, int(original * rope["factor"]))
        assert mscale > 1
    else:
        assert cfg.context_length == int(max_pos * rope["factor"])


ROUTING_ERRORS = ["renormalisation flipped", "one expert fewer", "another expert's weights"]


@pytest.mark.parametrize("name,wrong", [(n, w) for n in ("qwen3moe-top2-f32", "qwen3moe-top3-dense-layer-bf16",
                                                         "qwen2moe-shared-f32") for w in ROUTING_ERRORS]
                         + [("qwen2moe-shared-f32", "shared expert ungated")])
def test_falsifier_wrong_experts_fail(name, wrong, tmp_path, monkeypatch):
    """The MoE cases can tell a wrong routing from the right one."""
    import dataclasses
    path, ref = make_model(tmp_path, **CASES[name])
    model = qwenc.load(path)
    t = model.transformer
    if wrong == "renormalisation flipped":
        t.config = dataclasses.replace(t.config, norm_topk_prob=not t.config.norm_topk_prob)
    elif wrong == "one expert fewer":
        t.config = dataclasses.replace(t.config, num_experts_per_tok=t.config.num_experts_per_tok - 1)
    elif wrong == "another expert's weights":
        for layer in model.weights.layers:
            if layer.experts:
                layer.experts = layer.experts[1:] + layer.experts[:1]
    else:  # the shared expert added at full weight instead of behind its sigmoid gate (sigmoid(100))
        from qwenc.model.weights import Linear
        for layer in model.weights.layers:
            if layer.shared_gate is not None:
                w = layer.shared_gate.weight
                zero = dataclasses.replace(w, dtype=0, data=np.zeros(w.shape, np.float32).view(np.uint8).reshape(-1))
                layer.shared_gate = Linear(zero, bias=np.array([100.0], np.float32))
    t.bind_experts()  # the layers of experts as they are now
    ids = prompt(24)
    err = np.abs(model.logits(ids, all_positions=True) - ref_logits(ref, ids)).max()
    assert err > TOL * 10, f"{wrong} went unnoticed: {err}"
