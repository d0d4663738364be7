"""Batching never changes results, end to end: a sequence's logits are bit-identical whether it runs alone or
in a step beside 1, 4 or 15 others, with its prompt read in one step or in chunks, in mixed
prefill + decode steps, in every activation mode and on every weight type; and on the real demo
model the engine's greedy tokens equal each prompt run alone."""
import numpy as np
import pytest

import gguf
import qwenc
from qwenc.engine.engine import Engine
from qwenc.formats.config import config_from_dict
from qwenc.formats.tensors import BF16, F16, F32, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, Tensor
from qwenc.model import StepItem, Weights

GT = gguf.GGMLQuantizationType
HIDDEN, INTER, LAYERS, HEADS, KV, HD, VOCAB = 256, 512, 2, 4, 2, 64, 1000

# K-quant blocks: (bytes, offsets of their f16 scale fields)
KBLOCK = {Q4_K: (144, (0, 2)), Q5_K: (176, (0, 2)), Q6_K: (210, (208,))}


def encode(x: np.ndarray, dtype: int, rng) -> np.ndarray:
    """The bytes of matrix x stored as dtype (K-quants: random codes at a sensible scale, since
    the gguf package cannot quantize them; what matters here is the kernels, not the values)."""
    if dtype == F32:
        return x.astype(np.float32).view(np.uint8).reshape(-1)
    if dtype in (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0):
        t = {F16: GT.F16, BF16: GT.BF16, Q4_0: GT.Q4_0, Q4_1: GT.Q4_1, Q5_0: GT.Q5_0, Q5_1: GT.Q5_1,
             Q8_0: GT.Q8_0}[dtype]
        return np.ascontiguousarray(gguf.quants.quantize(x.astype(np.float32), t)).view(np.uint8).reshape(-1)
    nbytes, scales = KBLOCK[dtype]
    blocks = x.size // 256
    raw = rng.integers(0, 256, (blocks, nbytes), dtype=np.uint8)
    scale = np.array([2e-4 if dtype != Q6_K else 1e-3], np.float16).view(np.uint8)
    for off in scales:
        raw[:, off:off + 2] = scale
    return raw.reshape(-1)


def tiny_model(dtype, activations, seed=0):
    rng = np.random.default_rng(seed)
    cfg = config_from_dict({
        "architectures": ["Qwen2ForCausalLM"], "hidden_size": HIDDEN, "intermediate_size": INTER,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV,
        "vocab_size": VOCAB, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 4096,
        "tie_word_embeddings": False}, "tiny")
    tensors = {}

    def mat(name, rows, cols, stored=dtype):
        x = rng.standard_normal((rows, cols)).astype(np.float32) / np.sqrt(cols)
        tensors[name] = Tensor(name, stored, (rows, cols), encode(x, stored, rng), "tiny")

    def vec(name, n, scale=1.0, base=0.0):
        v = (base + scale * rng.standard_normal(n)).astype(np.float32)
        tensors[name] = Tensor(name, F32, (n,), v.view(np.uint8), "tiny")
    mat("model.embed_tokens.weight", VOCAB, HIDDEN, F32)
    mat("lm_head.weight", VOCAB, HIDDEN)
    vec("model.norm.weight", HIDDEN, 0.1, 1.0)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        vec(p + "input_layernorm.weight", HIDDEN, 0.1, 1.0)
        vec(p + "post_attention_layernorm.weight", HIDDEN, 0.1, 1.0)
        for name, rows, cols in (("self_attn.q_proj", HEADS * HD, HIDDEN), ("self_attn.k_proj", KV * HD, HIDDEN),
                                 ("self_attn.v_proj", KV * HD, HIDDEN), ("self_attn.o_proj", HIDDEN, HEADS * HD),
                                 ("mlp.gate_proj", INTER, HIDDEN), ("mlp.up_proj", INTER, HIDDEN),
                                 ("mlp.down_proj", HIDDEN, INTER)):
            mat(p + name + ".weight", rows, cols)
        for name, n in (("q_proj", HEADS * HD), ("k_proj", KV * HD), ("v_proj", KV * HD)):
            vec(p + f"self_attn.{name}.bias", n, 0.1)
    return qwenc.Model(cfg, Weights(cfg, tensors), context=512, activations=activations)


def alone(model, prompt, steps):
    """Logits rows of one sequence run by itself: the prompt in one step, then greedy decode."""
    seq = model.new_sequence(128)
    rows = [model.step([StepItem(seq, prompt)])[0]]
    for _ in range(steps):
        rows.append(model.step([StepItem(seq, [int(np.argmax(rows[-1]))])])[0])
    return rows


def together(model, prompts, steps, chunk_rng):
    """The same sequences run together: each starts at its own step, reads its prompt in random
    chunks, and decodes beside the others' prefill chunks (mixed steps)."""
    seqs = [model.new_sequence(128) for _ in prompts]
    start = [i % 3 for i in range(len(prompts))]
    fed = [0] * len(prompts)
    rows = [[] for _ in prompts]
    t = 0
    while any(len(r) < steps + 1 for r in rows):
        items, owners = [], []
        for i, p in enumerate(prompts):
            if t < start[i] or len(rows[i]) == steps + 1:
                continue
            if fed[i] < len(p):
                n = int(chunk_rng.integers(1, len(p) - fed[i] + 1))
                toks = p[fed[i]:fed[i] + n]
                fed[i] += n
                want = "last" if fed[i] == len(p) else "none"
            else:
                toks, want = [int(np.argmax(rows[i][-1]))], "last"
            items.append(StepItem(seqs[i], toks, want))
            owners.append((i, want))
        out = model.step(items)
        k = 0
        for i, want in owners:
            if want == "last":
                rows[i].append(out[k])
                k += 1
        t += 1
    return rows


TYPES = {"f32": F32, "bf16": BF16, "f16": F16, "q8_0": Q8_0, "q4_0": Q4_0, "q4_1": Q4_1, "q5_0": Q5_0,
         "q5_1": Q5_1, "q4_k": Q4_K, "q5_k": Q5_K, "q6_k": Q6_K}


# the activation modes apply to block-quantized weights; float weights have one arithmetic only
CASES = [(t, a) for t in TYPES for a in ("f32", "int16", "int8") if a == "f32" or TYPES[t] not in (F32, F16, BF16)]


@pytest.mark.parametrize("type_name,activations", CASES)
def test_logits_do_not_depend_on_the_batch(type_name, activations):
    model = tiny_model(TYPES[type_name], activations)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, VOCAB, int(n)).tolist() for n in rng.integers(1, 40, 16)]
    steps = 3
    ref = [alone(model, p, steps) for p in prompts]
    for size in (2, 5, 16):
        got = together(model, prompts[:size], steps, np.random.default_rng(size))
        for i in range(size):
            for k in range(steps + 1):
                assert np.array_equal(got[i][k], ref[i][k]), \
                    f"sequence {i}, step {k}, batch of {size}: max diff {np.abs(got[i][k] - ref[i][k]).max()}"


@pytest.mark.parametrize("activations", ["f32", "int16", "int8"])
def test_real_model_engine_equals_alone(demo_gguf, activations):
    model = qwenc.load(demo_gguf, context=1024, activations=activations)
    prompts = ["def fib(n):", "The capital of France is", "import numpy as np\n", "# quicksort\n",
               "SELECT name FROM", "Once upon a time,", "fn main() {", "<!DOCTYPE html>",
               "class Node:", "1, 1, 2, 3, 5,", "Dear team,", "#include <vector>",
               "Q: why is the sky blue?\nA:", "package main", "The mitochondria", "const x ="]
    ref = [list(model.generate_tokens(model.tokenizer.encode(p), max_tokens=12, temperature=0)) for p in prompts]
    with Engine(model, max_batch=16, kv_memory="256MiB", max_step_tokens=24, start=False) as engine:
        streams = [engine.submit(p, max_tokens=12, temperature=0) for p in prompts]
        engine.start()
        got = [s.result().token_ids for s in streams]
    assert got == ref
