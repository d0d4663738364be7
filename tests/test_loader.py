"""Loading model directories: what loads, what is refused, and that weights are not copied."""
import json
import struct

import numpy as np
import pytest

import qwenc
from qwenc.formats.tensors import BF16, F32
from modelgen import make_model


@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory):
    path, ref = make_model(tmp_path_factory.mktemp("bf16"), arch="qwen2", dtype="bf16")
    return path, ref


def edit_config(path, **changes):
    cfg_path = path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    cfg_path.write_text(json.dumps(cfg))


def copy_model(src, dst):
    import shutil
    shutil.copytree(src, dst)
    return dst


def test_bf16_stays_bf16_and_memory_mapped(bf16_model):
    path, _ = bf16_model
    model = qwenc.load(path)
    w = model.weights.layers[0].q.weight
    assert w.dtype == BF16
    assert isinstance(w.data.base, np.memmap) or isinstance(w.data, np.memmap)
    assert not w.data.flags.writeable  # a read-only view of the file, not a copy


def test_dtype_f32_converts_and_agrees(bf16_model):
    path, _ = bf16_model
    ids = [1, 5, 9, 200, 3]
    a = qwenc.load(path).logits(ids, all_positions=True)
    model = qwenc.load(path, dtype="f32")
    assert model.weights.layers[0].q.weight.dtype == F32
    np.testing.assert_allclose(model.logits(ids, all_positions=True), a, atol=1e-5)


def test_dtype_rejected(bf16_model):
    with pytest.raises(ValueError, match="dtype"):
        qwenc.load(bf16_model[0], dtype="int3")


def test_activation_modes(bf16_model):
    """The activation modes on block-quantized weights (q8_0 re-encoding): int16 is the
    default; it stays within ~1e-5 of f32, int8 within ~1e-2, and both really differ from it
    (the integer paths run). In every mode a prefill's rows get the arithmetic of decode's: its
    logits are the token-by-token ones, bit for bit. Float weights ignore the setting."""
    path, _ = bf16_model
    ids = [1, 5, 9, 200, 3, 77]

    def decode_logits(model):
        seq = model.new_sequence()
        return np.stack([np.asarray(model.forward(seq, [t])).reshape(-1) for t in ids])

    assert qwenc.load(path, dtype="q8_0").activations == "int16"  # the default
    exact = qwenc.load(path, dtype="q8_0", activations="f32")
    assert exact.activations == "f32"
    ref = decode_logits(exact)
    np.testing.assert_array_equal(exact.logits(ids, all_positions=True), ref)
    scale = np.abs(ref).max()
    errs = {}
    for mode, tol in [("int16", 5e-4), ("int8", 5e-2)]:
        model = qwenc.load(path, dtype="q8_0", activations=mode)
        assert model.activations == mode
        got = decode_logits(model)
        errs[mode] = np.abs(got - ref).max() / scale
        assert 0 < errs[mode] < tol, (mode, errs[mode])
        np.testing.assert_array_equal(model.logits(ids, all_positions=True), got)
    assert errs["int16"] * 20 < errs["int8"], errs
    # the int modes run on repacked copies; a re-encoded (in-memory) original is not kept beside one
    w = qwenc.load(path, dtype="q8_0", activations="int8").weights
    for lin in w.linears():
        assert lin.packed is not None and lin.packed.dtype == 256 + 8
        tied = lin is w.head and w.lm_head is w.embed
        assert (lin.weight is lin.packed) != tied
    assert all(lin.packed is None for lin in exact.weights.linears())  # f32 keeps the stored layout
    # BF16 weights: no integer path, so every mode computes the same thing
    a = decode_logits(qwenc.load(path))
    np.testing.assert_array_equal(decode_logits(qwenc.load(path, activations="int8")), a)
    with pytest.raises(ValueError, match="activations"):
        qwenc.load(path, activations="int4")


def test_no_tokenizer_files_still_loads(bf16_model):
    model = qwenc.load(bf16_model[0])
    assert model.tokenizer is None
    toks = list(model.generate_tokens([1, 2, 3], max_tokens=5, temperature=0, stop_token_ids=[]))
    assert len(toks) == 5 and all(0 <= t < 384 for t in toks)


def test_context_exceeded_is_a_clear_error(bf16_model):
    model = qwenc.load(bf16_model[0], context=8)
    with pytest.raises(qwenc.ContextLengthExceeded, match="context_length_exceeded"):
        model.forward(model.new_sequence(), list(range(9)))
    seq = model.new_sequence()
    model.forward(seq, list(range(8)))
    with pytest.raises(qwenc.ContextLengthExceeded):
        model.forward(seq, [1])
    # generation stops with "length" when the cache is full, instead of failing mid-answer
    gen = model.generate_tokens(list(range(6)), max_tokens=50, temperature=0, stop_token_ids=[])
    out = []
    try:
        while True:
            out.append(next(gen))
    except StopIteration as stop:
        assert stop.value == "length"
    assert len(out) == 3


def test_threads_from_environment(bf16_model, monkeypatch):
    monkeypatch.setenv("QWENC_THREADS", "1")
    assert qwenc.load(bf16_model[0]).threads == 1
    assert qwenc.load(bf16_model[0], threads=2).threads == 2


@pytest.mark.parametrize("changes,message", [
    (dict(architectures=["LlamaForCausalLM"], model_type="llama"), "unsupported architecture"),
    # scalings that depend on the sequence's length (so on what else is batched) or are not Qwen's
    (dict(rope_parameters={"rope_type": "dynamic", "factor": 4.0, "rope_theta": 1e6}), "dynamic"),
    (dict(rope_scaling={"type": "longrope", "factor": 2.0}), "longrope"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "llama3"),
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6},
          rope_scaling={"type": "linear", "factor": 2.0}), "disagree"),
    (dict(rope_scaling={"type": "yarn", "factor": 4.0, "partial_rotary_factor": 0.5}), "partial_rotary"),
    (dict(rope_scaling={"type": "yarn", "factor": -4.0}), "factor"),
    (dict(rope_scaling={"type": "linear"}), "factor"),
    (dict(rope_scaling={"type": "yarn", "factor": 4.0, "truncate": "no"}), "truncate"),
    (dict(use_sliding_window=True, sliding_window=128), "sliding"),
    (dict(hidden_size=None), "hidden_size"),
    (dict(num_key_value_heads=3), "kv heads"),
])
def test_refused_configs(bf16_model, tmp_path, changes, message):
    path = copy_model(bf16_model[0], tmp_path / "m")
    edit_config(path, **changes)
    with pytest.raises(qwenc.ConfigError, match=message) as exc:
        qwenc.load(path)
    assert "config.json" in str(exc.value)


def test_rope_scaling_override_equals_the_config_saying_it(bf16_model, tmp_path):
    """load(rope_scaling=...) runs what the same scaling in config.json runs (which
    test_parity.py holds to transformers); {} turns a file's scaling off; a bad one is refused."""
    path = bf16_model[0]
    yarn = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    scaled = copy_model(path, tmp_path / "scaled")
    edit_config(scaled, rope_scaling=yarn)
    ids = list(range(3, 60))
    want = qwenc.load(scaled).logits(ids, all_positions=True)
    over = qwenc.load(path, rope_scaling=yarn)
    assert over.config.rope_scaling.kind == "yarn" and over.config.context_length == 512
    np.testing.assert_array_equal(over.logits(ids, all_positions=True), want)
    plain = qwenc.load(path).logits(ids, all_positions=True)
    assert np.abs(plain - want).max() > 1e-2
    np.testing.assert_array_equal(qwenc.load(scaled, rope_scaling={}).logits(ids, all_positions=True), plain)
    for bad, message in [("yarn", "object"), ({"type": "dynamic", "factor": 2.0}, "dynamic"),
                         ({"type": "yarn", "factor": "4"}, "factor")]:
        with pytest.raises(qwenc.InvalidRequest, match=message):
            qwenc.load(path, rope_scaling=bad)


def test_cli_rope_scaling(bf16_model, capsys):
    from qwenc import cli
    with pytest.raises(SystemExit):
        cli.main(["gen", "-m", str(bf16_model[0]), "--rope-scaling", "yarn", "hi"])
    assert "JSON" in capsys.readouterr().err


def rewrite_safetensors(path, drop=None, reshape=None):
    """Rewrite model.safetensors without tensor `drop`, or with `reshape` = (name, new_shape)."""
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(path))
    if drop:
        del tensors[drop]
    if reshape:
        name, shape = reshape
        tensors[name] = np.zeros(shape, dtype=tensors[name].dtype)
    save_file(tensors, str(path))


def test_missing_tensor_names_file_and_tensor(tmp_path):
    path, _ = make_model(tmp_path / "m", arch="qwen2", dtype="f32")
    rewrite_safetensors(path / "model.safetensors", drop="model.layers.1.mlp.up_proj.weight")
    with pytest.raises(qwenc.WeightError, match=r"model\.layers\.1\.mlp\.up_proj\.weight") as exc:
        qwenc.load(path)
    assert "model.safetensors" in str(exc.value)


def test_misshapen_tensor_is_refused(tmp_path):
    path, _ = make_model(tmp_path / "m", arch="qwen2", dtype="f32")
    rewrite_safetensors(path / "model.safetensors", reshape=("model.layers.0.self_attn.k_proj.weight", (64, 64)))
    with pytest.raises(qwenc.WeightError, match=r"k_proj\.weight.*\[64, 64\]"):
        qwenc.load(path)


def test_corrupt_safetensors_is_refused(tmp_path):
    path, _ = make_model(tmp_path / "m", arch="qwen2", dtype="f32")
    f = path / "model.safetensors"
    f.write_bytes(struct.pack("<Q", 10 ** 9) + b"{}")
    with pytest.raises(ValueError, match="model.safetensors"):
        qwenc.load(path)
    f.write_bytes(b"\x01")
    with pytest.raises(ValueError, match="model.safetensors"):
        qwenc.load(path)


def test_truncated_tensor_data_is_refused(tmp_path):
    path, _ = make_model(tmp_path / "m", arch="qwen2", dtype="f32")
    f = path / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(ValueError, match="outside the file"):
        qwenc.load(path)


def test_missing_shard_is_refused(tmp_path):
    path, _ = make_model(tmp_path / "m", arch="qwen2", dtype="f32", shard_size="60KB")
    shard = sorted(path.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(ValueError, match=shard.name):
        qwenc.load(path)


def test_not_a_model(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"hello")
    with pytest.raises(ValueError):
        qwenc.load(tmp_path / "x.bin")
    with pytest.raises(FileNotFoundError):
        qwenc.load(tmp_path / "nope")
    with pytest.raises(qwenc.ConfigError, match="config.json"):
        qwenc.load(tmp_path)


def test_untied_config_without_lm_head_is_refused(tmp_path):
    """The embedding used to stand in for a missing head: a model, but not the one described."""
    path, _ = make_model(tmp_path / "m", arch="qwen2", dtype="f32", tie_word_embeddings=False)
    rewrite_safetensors(path / "model.safetensors", drop="lm_head.weight")
    with pytest.raises(qwenc.WeightError, match=r"lm_head\.weight missing") as exc:
        qwenc.load(path)
    assert "model.safetensors" in str(exc.value)
    # tied, the same file is complete
    edit_config(path, tie_word_embeddings=True)
    model = qwenc.load(path)
    assert model.weights.lm_head is model.weights.embed


def test_decode_batch_of_nothing(bf16_model):
    model = qwenc.load(bf16_model[0])
    out = model.decode_batch([], [])
    assert out.shape == (0, model.config.vocab_size) and out.dtype == np.float32


@pytest.mark.parametrize("bad", [dict(seed=-1), dict(seed="x"), dict(top_k=-2), dict(temperature="hot"),
                                 dict(max_tokens=-1), dict(max_tokens="9"), dict(max_tokens=None)])
def test_bad_request_fails_before_the_prefill(bf16_model, monkeypatch, bad):
    """Every setting is checked before any compute (an invalid seed used to fail only after the
    prefill, when the sampler was built)."""
    model = qwenc.load(bf16_model[0])
    steps = []
    monkeypatch.setattr(model, "step", lambda items: steps.append(items))
    with pytest.raises(qwenc.InvalidRequest):
        list(model.generate_tokens([1, 2, 3], **{"max_tokens": 4, "temperature": 1.0, **bad}))
    assert steps == []


@pytest.mark.parametrize("changes,message", [
    (dict(num_experts=None, num_local_experts=None), "num_local_experts"),
    (dict(num_experts_per_tok=9), "num_experts_per_tok"),
    (dict(moe_intermediate_size=None), "moe_intermediate_size"),
    (dict(mlp_only_layers="1"), "mlp_only_layers"),
    (dict(architectures=["Qwen2MoeForCausalLM"]), "shared_expert_intermediate_size"),
])
def test_refused_moe_configs(changes, message):
    from qwenc.formats.config import config_from_dict
    cfg = dict(architectures=["Qwen3MoeForCausalLM"], hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=96, vocab_size=384, num_hidden_layers=4, rope_theta=1e6, num_experts=8,
               num_experts_per_tok=2, moe_intermediate_size=64, decoder_sparse_step=2, mlp_only_layers=[3])
    ok = config_from_dict(dict(cfg))
    # transformers' rule: every decoder_sparse_step-th layer, less mlp_only_layers
    assert ok.moe_layers == (1,) and ok.qk_norm and not ok.attention_bias
    assert ok.shared_expert_intermediate_size == 0  # Qwen3-MoE has none (a stray key is ignored, as there)
    q2 = config_from_dict(dict(cfg, architectures=["Qwen2MoeForCausalLM"], shared_expert_intermediate_size=96))
    assert q2.shared_expert_intermediate_size == 96 and q2.attention_bias and not q2.qk_norm
    cfg.update(changes)
    with pytest.raises(qwenc.ConfigError, match=message):
        config_from_dict({k: v for k, v in cfg.items() if v is not None})


def test_bf16_weights_take_their_repacked_layout_with_the_same_logits(tmp_path, monkeypatch):
    """BF16 matrices are repacked for the float row kernel in every mode, and give the logits the
    stored layout gives, bit for bit, prefill and decode. A file's matrices stay mapped beside the
    copy; a tied table converted in memory is kept once, repacked, and the lookup reads it."""
    from qwenc import _ops
    path, _ = make_model(tmp_path / "tied", arch="qwen2", dtype="f32", tie_word_embeddings=True)
    ids = [1, 5, 9, 200, 3, 77]

    def run(model):
        seq = model.new_sequence(16)
        rows = model.forward(seq, ids, all_positions=True)
        return np.concatenate([rows, model.forward(seq, [11])[None], model.forward(seq, [12])[None]])

    tied = qwenc.load(path, dtype="bf16")
    w = tied.weights
    assert w.head.packed is not None and w.head.packed.dtype == _ops.r8_of(BF16)
    assert w.embed is w.head.packed and w.lm_head is w.embed  # one copy of the table
    assert w.layers[0].q.weight is w.layers[0].q.packed  # the converted original is dropped
    got = run(tied)
    monkeypatch.setattr(_ops, "repacks", lambda dtype, K: False)
    stored = qwenc.load(path, dtype="bf16")
    assert stored.weights.head.packed is None and stored.weights.embed.dtype == BF16
    assert np.array_equal(got.view(np.uint32), run(stored).view(np.uint32))


def test_mapped_bf16_keeps_its_file_beside_the_copy(bf16_model):
    from qwenc import _ops
    model = qwenc.load(bf16_model[0])
    lin = model.weights.layers[0].q
    assert lin.weight.dtype == BF16 and lin.packed.dtype == _ops.r8_of(BF16)
    assert not lin.weight.data.flags.writeable  # still the file's bytes
