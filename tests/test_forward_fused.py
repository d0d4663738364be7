"""The decoder layers run in one C call (_ops.forward_layers) give the bits of the per-layer path
(Transformer._block, kernel by kernel from Python), on Qwen2 (q/k/v biases), Qwen3 (q/k norms) and
their mixture-of-experts kin (layers of experts beside a dense one), in every activation mode and KV dtype, for prefill, decode and a step of several sequences of one
shared cache. A falsifier shows the comparison sees a one-ulp change of one norm weight."""
import numpy as np
import pytest

import qwenc
from qwenc.model.forward import KVCache, Sequence, StepItem
from modelgen import make_model

CASES = [  # (arch, dtype, activations, kv_cache)
    ("qwen2", None, "f32", "f32"),
    ("qwen3", None, "f32", "f16"),
    ("qwen2", "q8_0", "int16", "auto"),
    ("qwen3", "q8_0", "int16", "f32"),
    ("qwen2", "q8_0", "int8", "f16"),
    ("qwen3", "q8_0", "f32", "auto"),
    ("qwen3_moe", None, "f32", "f32"),
    ("qwen3_moe", "q8_0", "int16", "auto"),
    ("qwen2_moe", "q8_0", "int8", "f16"),
    ("qwen2_moe", None, "f32", "auto"),
]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    # rows a multiple of Q8_0's 32-value block; 3 layers; 6 query heads over 2 kv heads of 32
    shape = dict(hidden_size=192, intermediate_size=352, num_hidden_layers=3, num_attention_heads=6,
                 num_key_value_heads=2)
    # experts: 3 of 8 (Qwen3-MoE), 2 of 8 and a shared expert (Qwen2-MoE), the middle layer dense
    moe = dict(moe_intermediate_size=96, num_experts_per_tok=3, mlp_only_layers=[1])
    extra = {"qwen2": {}, "qwen3": {"head_dim": 32}, "qwen3_moe": {"head_dim": 32, **moe},
             "qwen2_moe": dict(moe, num_experts_per_tok=2, shared_expert_intermediate_size=128)}
    return {arch: make_model(tmp_path_factory.mktemp(arch), arch=arch, seed=11, **shape, **kw)[0]
            for arch, kw in extra.items()}


def run_steps(model, fused):
    """Prefill (every position's logits), decode steps, then one step over three sequences of a
    shared cache (two decoding, one prefilling): every logit row, in order."""
    model.transformer.fused = fused
    rng = np.random.default_rng(5)
    out = []
    seq = model.new_sequence(96)
    out.append(model.forward(seq, rng.integers(0, 384, 37).tolist(), all_positions=True))
    for _ in range(4):
        out.append(model.forward(seq, [int(np.argmax(out[-1][-1]))])[None])
    cache = KVCache(model.config, 24, dtype=model.transformer.kv_dtype)
    seqs = [Sequence(cache, [3, 1, 7], 48), Sequence(cache, [0, 5, 9], 48), Sequence(cache, [2, 11, 4], 48)]
    model.step([StepItem(seqs[0], rng.integers(0, 384, 20).tolist(), "none"),
                StepItem(seqs[1], rng.integers(0, 384, 3).tolist(), "none")])
    out.append(model.step([StepItem(seqs[0], [17], "last"), StepItem(seqs[1], [250], "last"),
                           StepItem(seqs[2], rng.integers(0, 384, 18).tolist(), "all")]))
    return out


@pytest.mark.parametrize("arch,dtype,act,kv", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_fused_layers_equal_per_layer_path(model_dirs, arch, dtype, act, kv):
    model = qwenc.load(str(model_dirs[arch]), dtype=dtype, activations=act, kv_cache=kv, context=128, threads=2)
    fused, stepwise = run_steps(model, True), run_steps(model, False)
    assert len(fused) == len(stepwise)
    for a, b in zip(fused, stepwise):
        assert a.shape == b.shape
        np.testing.assert_array_equal(a, b)


def test_falsifier_sees_one_ulp_in_a_norm_weight(model_dirs):
    # the exact mode: an integer mode's rounding of activations to codes could absorb one ulp
    model = qwenc.load(str(model_dirs["qwen3"]), activations="f32", context=128, threads=2)
    ids = list(range(5, 40))
    model.transformer.fused = True
    a = model.logits(ids, all_positions=True)
    w = model.weights.layers[1].mlp_norm
    kept = w[7]
    try:
        w[7] = np.nextafter(kept, np.float32(2))
        model.transformer.fused = False
        b = model.logits(ids, all_positions=True)
    finally:
        w[7] = kept
    assert not np.array_equal(a, b)


def test_stack_follows_workspace_and_lives_with_its_cache(model_dirs):
    """A step longer than any before grows the workspace: the layers are bound to the new
    buffers (the result still equals the per-layer path's); the binding is held by the cache."""
    model = qwenc.load(str(model_dirs["qwen2"]), dtype="q8_0", activations="int16", context=256, threads=2)
    seq = model.new_sequence(256)
    model.forward(seq, [1, 2, 3])
    first = seq.cache.layer_stack
    long_ids = list(range(40, 240))
    got = model.forward(seq, long_ids)
    assert seq.cache.layer_stack is not first and seq.cache.layer_stack[1] is model.transformer._ws
    model.transformer.fused = False
    seq2 = model.new_sequence(256)
    model.forward(seq2, [1, 2, 3])
    np.testing.assert_array_equal(got, model.forward(seq2, long_ids))
    assert seq2.cache.layer_stack is None


@pytest.mark.parametrize("table", [[0, 9], [0, -1], [4]], ids=["past-pool", "negative", "first-past-pool"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "per-layer"])
def test_block_ids_outside_the_pool_are_refused(model_dirs, table, fused):
    """A sequence whose block table names a block the cache does not have gets a ValueError from
    either path before any kernel runs, never a read or write outside the pools."""
    model = qwenc.load(str(model_dirs["qwen2"]), dtype="q8_0", activations="int16", context=64, threads=2)
    model.transformer.fused = fused
    cache = KVCache(model.config, 4, dtype=model.transformer.kv_dtype)
    seq = Sequence(cache, table, 16 * len(table))
    with pytest.raises(ValueError, match="outside the pool"):
        model.step([StepItem(seq, list(range(1, 16 * len(table) + 1)))])


def test_shared_sequences_are_one_group_with_own_blocks(model_dirs):
    """Sequence.shared: one cache, each sequence its own blocks covering its capacity, so a step
    over them is one group, and each row's logits are those of the sequence decoded alone."""
    model = qwenc.load(str(model_dirs["qwen2"]), dtype="q8_0", activations="int16", context=128, threads=2)
    caps = [20, 33, 16]
    seqs = Sequence.shared(model.config, caps, model.transformer.kv_dtype)
    assert len({id(s.cache) for s in seqs}) == 1
    tables = [s.block_table.tolist() for s in seqs]
    assert sorted(sum(tables, [])) == list(range(seqs[0].cache.num_blocks))
    assert [len(t) * seqs[0].cache.block_size >= c for t, c in zip(tables, caps)] == [True] * 3
    assert [s.capacity for s in seqs] == caps
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, 384, n).tolist() for n in (7, 12, 3)]
    pos = np.concatenate([np.arange(len(p)) for p in prompts])
    assert len(model.transformer._groups([StepItem(s, p) for s, p in zip(seqs, prompts)], pos)) == 1
    together = model.step([StepItem(s, p) for s, p in zip(seqs, prompts)])
    for row, p in zip(together, prompts):
        np.testing.assert_array_equal(row, model.forward(model.new_sequence(40), p))


def test_a_steps_logits_stay_while_held_and_their_memory_is_reused_after(model_dirs):
    """A step's logits are written into the last step's memory only when nothing holds that array
    or any view of it: logits (or a row of them) kept by the caller keep their values through
    later steps, and memory released is taken again; every logits array starts on a 64-byte line."""
    model = qwenc.load(str(model_dirs["qwen2"]), dtype="q8_0", activations="int16", context=64, threads=2)
    a, b = model.new_sequence(), model.new_sequence()
    kept = model.step([StepItem(a, [1, 2, 3])])
    want = kept.copy()
    row = model.step([StepItem(b, [4, 5])])[0]  # only a view of the second step's logits is held
    row_want = row.copy()
    third = model.step([StepItem(a, [6])])
    np.testing.assert_array_equal(kept, want)
    np.testing.assert_array_equal(row, row_want)
    assert not np.shares_memory(third, kept) and not np.shares_memory(third, row)
    assert all(x.ctypes.data % 64 == 0 for x in (kept, row, third))
    at = third.ctypes.data
    del third
    again = model.step([StepItem(b, [7])])
    assert again.ctypes.data == at  # released, so reused
    fresh = qwenc.load(str(model_dirs["qwen2"]), dtype="q8_0", activations="int16", context=64, threads=2)
    c = fresh.new_sequence()
    fresh.step([StepItem(c, [4, 5])])
    np.testing.assert_array_equal(again, fresh.step([StepItem(c, [7])]))  # b's logits, as a new array holds them
