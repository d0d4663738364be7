"""The real demo model (Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF) against transformers.

transformers loads the same GGUF with dtype=float32: it dequantizes every block to float32 and
runs its own Qwen2 code, so it computes exactly the function the file describes. qwenc reads the
blocks directly; the two must then agree up to float rounding. Checks:

- logits at every position of 2,000+ tokens of prose, code and Chinese (tests/data/
  real_model_texts.json, each text its own sequence of up to 512 tokens): top-1 agreement 100%
  and mean KL(transformers || qwenc) below 1e-8 nats, as README.md reports for the stored weights;
- 48-token greedy continuations of 12 prompts (raw and chat-templated) identical, all 12 (README:
  "12 of 12"); a divergence at a near-tie (transformers' own top-2 gap below 1e-3) is reported
  as such, and fails the count;
- dtype="q8_0", "bf16" and "f32" (re-encoded from the dequantized weights) over the same
  positions, each within a small margin of the agreement and KL of README.md's quality table;
- decode's activation modes token by token over 256 positions, each rejecting the next cheaper;
- falsifiers: a wrong RoPE theta and missing q/k biases fail the stored weights' thresholds.

The reference (~3 GB, about a minute to build) is loaded once for the module. Run with -s to see
the measured figures; they are also in every assertion message.
"""
import gc
import inspect
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from real_model_quality import (WINDOW, Tally, compare_logits, decode_logits, load_reference,  # noqa: E402
                                reference_logits, tally, text_windows)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import qwenc  # noqa: E402
from qwenc.engine.generate import render_chat  # noqa: E402

# The stored weights against their own float32 dequantization: README.md's 100.00% and 4.9e-12.
MIN_AGREEMENT, MAX_KL = 1.0, 1e-8
# README.md's quality table for the re-encoded dtypes (top-1 agreement, mean KL), over the
# suite's positions; a run must come within AGREEMENT_MARGIN below and KL_MARGIN times above.
# (Measured by bench/real_model_quality.py; update both together.)
# f32's KL is float rounding on both sides: 4.9e-12 on the AMD machines, 1.0e-11 on an Intel Xeon
# with every qwenc kernel path (most likely transformers' own products rounding differently
# there); the figure kept is the larger, as the README says.
README_REENCODED = {"q8_0": (0.9967, 1.6e-4), "bf16": (0.9991, 2.5e-5), "f32": (1.0, 1.0e-11)}
AGREEMENT_MARGIN, KL_MARGIN = 0.0025, 1.25
GREEDY_TOKENS, TIE_GAP = 48, 1e-3


@pytest.fixture(scope="module")
def ours(demo_gguf):
    """The exact mode: float32 activations, what transformers computes on the same weights."""
    return qwenc.load(demo_gguf, context=1024, activations="f32")


@pytest.fixture(scope="module")
def ref(demo_gguf):
    model = load_reference(demo_gguf)
    yield model
    del model
    gc.collect()


@pytest.fixture(scope="module")
def ref_logits(ref):
    """transformers' logits for a token list, kept for the module (the suite's 2,152 positions
    take 1.3 GB): the dtype and falsifier tests reuse them instead of paying for another float32
    forward pass."""
    kept = {}

    def get(ids):
        key = tuple(ids)
        if key not in kept:
            kept[key] = reference_logits(ref, key)
        return kept[key]
    yield get
    kept.clear()


@pytest.fixture(scope="module")
def windows(ours):
    w = text_windows(ours.tokenizer)
    # The data file and the tokenizer decide the count; the issue asks for at least 2,000 tokens.
    assert sum(len(ids) for _, ids in w) >= 2000, [(n, len(ids)) for n, ids in w]
    return w


@pytest.fixture(scope="module")
def long_window(windows):
    """The 512-token Python window, for the cheaper checks."""
    name, ids = next((n, ids) for n, ids in windows if n == "python_lru")
    assert len(ids) == WINDOW
    return ids


# ---------------------------------------------------------------- logits at every position

def test_logits_agree_over_2000_tokens(ours, windows, ref_logits):
    total = Tally()
    per_text = []
    for name, ids in windows:
        agree, kl = compare_logits(ref_logits(ids), ours.logits(ids, all_positions=True), ours.n_vocab)
        total.add(agree, kl)
        per_text.append(f"{name}: {len(ids)} tokens, {100 * agree.mean():.2f}% agree, mean KL {kl.mean():.3g}")
    report = f"stored Q4_K_M vs transformers float32 over {total}\n  " + "\n  ".join(per_text)
    print("\n" + report)
    assert total.positions >= 2000
    assert total.agreement >= MIN_AGREEMENT, report
    assert total.mean_kl < MAX_KL, report


# ---------------------------------------------------------------- greedy continuations

RAW_PROMPTS = [
    "def quicksort(arr):",
    "#include <stdio.h>\n\n/* Print the first 20 Fibonacci numbers. */\nint main(void)\n{\n",
    "// Return a copy of the array without duplicates, keeping the first occurrence.\nfunction unique(xs) {",
    "The old harbour town woke slowly. By seven the fishing boats had",
    "在一个下着小雨的早晨，",
    "SELECT department, AVG(salary) AS avg_salary\nFROM employees\n",
]
CHAT_PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain, in a short paragraph, how a hash table handles collisions.",
    "用中文解释一下什么是递归，并给出一个例子。",
    "Write a Rust function that reverses the words in a sentence.",
    "Write a short story opening about a lighthouse keeper who finds a message in a bottle.",
    "Why does this Python loop skip elements? for x in xs:\n    if x % 2 == 0:\n        xs.remove(x)",
]


def _prompt_ids(model):
    out = [("raw: " + p, model.tokenizer.encode(p)) for p in RAW_PROMPTS]
    for p in CHAT_PROMPTS:
        text = render_chat(model, [{"role": "user", "content": p}])
        out.append(("chat: " + p, model.tokenizer.encode(text)))
    return out


def _reference_greedy(ref, prompts, n):
    """transformers' greedy tokens and raw per-step logits for all prompts in one left-padded
    batch: the float32 model reads 2.5 GB of weights per step, so one batched pass of 48 steps
    costs what a single prompt would. A plain loop over the model's forward rather than
    `generate`: generate fills unset options (EOS ids, sampling settings) from the model's
    generation config, and stopping at <|im_end|> would cut the 48 steps short."""
    width = max(len(ids) for _, ids in prompts)
    pad = 151643  # <|endoftext|>; masked out, so its value does not matter
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for _, ids in prompts])
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for _, ids in prompts])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # each prompt starts at position 0
    # transformers 5.2x renamed past_key_values to cache (the old name warns); accept both.
    cache_arg = "cache" if "cache" in inspect.signature(ref.forward).parameters else "past_key_values"
    tokens, steps = [], []
    with torch.inference_mode():
        out = ref(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                  logits_to_keep=1)
        for i in range(n):
            last = out.logits[:, -1].float()
            steps.append(last.numpy())
            token = last.argmax(-1, keepdim=True)
            tokens.append(token)
            if i + 1 == n:
                break
            mask = torch.cat([mask, torch.ones_like(token)], dim=1)
            positions = positions[:, -1:] + 1
            out = ref(input_ids=token, attention_mask=mask, position_ids=positions,
                      use_cache=True, **{cache_arg: getattr(out, cache_arg)})
    return torch.cat(tokens, dim=1).tolist(), np.stack(steps, axis=1)  # [prompt, step], [prompt, step, vocab]


def first_divergence(ours, theirs, ref_step_logits, tie_gap=TIE_GAP):
    """Compare greedy runs under the near-tie rule: at the first step where they differ,
    transformers' top-2 gap there must be below `tie_gap`, and comparison stops. Returns
    (steps compared and equal, gap at the divergence or None); raises AssertionError otherwise."""
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            top2 = np.sort(ref_step_logits[i])[-2:]
            gap = float(top2[1] - top2[0])
            assert gap < tie_gap, f"diverged at step {i} (qwenc {a}, transformers {b}), reference top-2 gap {gap:.4g}"
            return i, gap
    assert len(ours) == len(theirs)
    return len(ours), None


@pytest.fixture(scope="module")
def greedy_reference(ours, ref):
    """The prompts, and transformers' greedy tokens and per-step logits for them."""
    prompts = _prompt_ids(ours)
    theirs, logits = _reference_greedy(ref, prompts, GREEDY_TOKENS)
    return prompts, theirs, logits


@pytest.mark.parametrize("activations", ["f32", "int16"])
def test_greedy_continuations_match(demo_gguf, ours, greedy_reference, activations):
    """The default (f32) and the int16 decode modes continue every prompt as transformers does,
    parting only at a near-tie."""
    model = ours if activations == "f32" else qwenc.load(demo_gguf, context=1024, activations=activations)
    prompts, theirs, logits = greedy_reference
    assert len(prompts) >= 10
    lines, identical, failures = [], 0, []
    for (label, ids), ref_tokens, ref_steps in zip(prompts, theirs, logits):
        mine = list(model.generate_tokens(ids, max_tokens=GREEDY_TOKENS, temperature=0, repetition_penalty=1.0,
                                          stop_token_ids=[]))
        assert len(mine) == GREEDY_TOKENS
        try:
            same, gap = first_divergence(mine, ref_tokens, ref_steps[:, :model.n_vocab])
        except AssertionError as exc:
            failures.append(f"{label[:50]!r}: {exc}")
            continue
        identical += gap is None
        lines.append(f"{label[:50]!r}: " + ("identical" if gap is None else f"near-tie at step {same} (gap {gap:.2g})")
                     + f" -> {model.tokenizer.decode(mine[:12])!r}...")
    report = (f"{activations}: {identical}/{len(prompts)} identical over {GREEDY_TOKENS} tokens\n  "
              + "\n  ".join(lines + failures))
    print("\n" + report)
    assert not failures, report
    assert len(prompts) == 12 and identical == len(prompts), report  # README: 12 of 12


def test_near_tie_rule_can_fail():
    """The rule itself: a divergence at a step with a clear winner is an error, at a tie it is not."""
    steps = np.zeros((3, 5), np.float32)
    steps[1, 2], steps[1, 3] = 5.0, 4.0          # step 1: clear winner (gap 1.0)
    with pytest.raises(AssertionError, match="gap"):
        first_divergence([0, 3, 1], [0, 2, 1], steps)
    steps[1, 3] = 5.0 - 5e-4                     # step 1: near-tie
    assert first_divergence([0, 3, 1], [0, 2, 4], steps) == (1, pytest.approx(5e-4, rel=1e-2))
    assert first_divergence([0, 2, 1], [0, 2, 1], steps) == (3, None)


# ---------------------------------------------------------------- re-encoded weights

@pytest.mark.parametrize("dtype", ["q8_0", "bf16", "f32"])
def test_reencoded_dtypes_match_the_readme(demo_gguf, dtype, windows, ref_logits):
    """Over the positions README.md's table was measured on, each re-encoding comes within a
    small margin of the figures it reports."""
    model = qwenc.load(demo_gguf, dtype=dtype, context=WINDOW)
    q = tally(model, windows, ref_logits)
    agreement, kl = README_REENCODED[dtype]
    print(f"\n{dtype} vs transformers float32: {q} (README: {100 * agreement:.2f}%, {kl:.2g})")
    assert q.positions == sum(len(ids) for _, ids in windows)
    assert q.agreement >= agreement - AGREEMENT_MARGIN, f"{dtype}: {q}"
    assert q.mean_kl <= kl * KL_MARGIN, f"{dtype}: {q}"


# ---------------------------------------------------------------- decode's activation modes

# (mode, KV cache, min top-1 agreement, max mean KL): f32 computes what transformers computes;
# int16 with a float32 KV cache stays within float-rounding distance of it; the default (int16
# with the float16 KV cache "auto" gives it) is held to the bar a default must meet (99.9% top-1,
# mean KL <= 1e-5; measured 100.00%, 8.2e-7 here); int8 trades a little agreement for speed
# (README: 99.40%, 5.1e-4).
ACTIVATION_BOUNDS = [("f32", "auto", 1.0, 1e-10), ("int16", "f32", 1.0, 1e-7), ("int16", "auto", 0.999, 1e-5),
                     ("int8", "auto", 0.98, 2e-3)]


@pytest.mark.parametrize("activations,kv_cache,min_agreement,max_kl", ACTIVATION_BOUNDS,
                         ids=[f"{b[0]}-kv{b[1]}" for b in ACTIVATION_BOUNDS])
def test_decode_activation_modes(demo_gguf, activations, kv_cache, min_agreement, max_kl, long_window, ref_logits):
    """Logits computed token by token (decode's path, where the modes apply) over the first 256
    positions of the cached window, against transformers. Each bound also rejects the next
    cheaper mode (int16 fails f32's KL bound, the float16 cache int16-with-float32's, int8 the
    default's), so the modes really differ."""
    n = 256
    model = qwenc.load(demo_gguf, context=n, activations=activations, kv_cache=kv_cache)
    assert model.transformer.kv_dtype == {"f32": "f32", "auto": "f32" if activations == "f32" else "f16"}[kv_cache]
    q = Tally()
    q.add(*compare_logits(ref_logits(long_window)[:n], decode_logits(model, long_window[:n]), model.n_vocab))
    print(f"\ndecode, activations {activations}, KV cache {model.transformer.kv_dtype} vs transformers float32: {q}")
    assert q.positions == n
    assert q.passes(min_agreement, max_kl), f"{activations}: {q}"
    i = [b[:2] for b in ACTIVATION_BOUNDS].index((activations, kv_cache))
    if i > 0:
        assert not q.passes(*ACTIVATION_BOUNDS[i - 1][2:]), f"{activations} indistinguishable from the mode above: {q}"


# ---------------------------------------------------------------- falsifiers

def _wrong_theta(model):
    """RoPE frequencies for theta 1e4 (the Llama default) instead of the file's 1e6."""
    hd = model.config.head_dim
    model.transformer.inv_freq = (1.0 / 1e4 ** (np.arange(0, hd, 2, dtype=np.float32) / hd)).astype(np.float32)


def _no_qk_bias(model):
    for layer in model.weights.layers:
        layer.q.bias = layer.k.bias = None


@pytest.mark.parametrize("breakage", [_wrong_theta, _no_qk_bias], ids=["rope-theta-1e4", "no-qk-bias"])
def test_falsifiers_fail_the_thresholds(demo_gguf, breakage, long_window, ref_logits):
    # The first 256 positions of the cached 512-token window: causal attention makes the
    # reference's rows there identical to a 256-token run, and half the window halves the cost.
    n = 256
    model = qwenc.load(demo_gguf, context=n)
    assert model.config.rope_theta == 1e6 and model.config.attention_bias  # what the breakages undo
    breakage(model)
    ids = long_window[:n]
    q = Tally()
    q.add(*compare_logits(ref_logits(long_window)[:n], model.logits(ids, all_positions=True), model.n_vocab))
    print(f"\n{breakage.__name__}: {q}")
    assert not q.passes(MIN_AGREEMENT, MAX_KL), f"{breakage.__name__} went unnoticed: {q}"


def test_yarn_agrees_with_transformers(demo_gguf, ref, long_window):
    """Qwen's YaRN recipe on the real model's shapes (head_dim 64, 14 query heads on 2 kv heads,
    theta 1e6): qwenc with rope_scaling against transformers with the same rope_parameters, held
    to the stored weights' thresholds; the plain model against the scaled reference fails them."""
    import copy
    yarn = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    n = 256
    ids = long_window[:n]
    config = copy.deepcopy(ref.config)
    config.rope_parameters = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
                              "rope_theta": ref.config.rope_parameters["rope_theta"]}
    plain_rotary = ref.model.rotary_emb
    ref.model.rotary_emb = type(plain_rotary)(config=config)
    try:
        assert ref.model.rotary_emb.attention_scaling > 1.1
        theirs = reference_logits(ref, ids)
    finally:
        ref.model.rotary_emb = plain_rotary
    scaled = qwenc.load(demo_gguf, context=n, activations="f32", rope_scaling=yarn)
    q = Tally()
    q.add(*compare_logits(theirs, scaled.logits(ids, all_positions=True), scaled.n_vocab))
    print(f"\nYaRN x4: {q}")
    assert q.passes(MIN_AGREEMENT, MAX_KL), q
    plain = qwenc.load(demo_gguf, context=n, activations="f32")
    p = Tally()
    p.add(*compare_logits(theirs, plain.logits(ids, all_positions=True), plain.n_vocab))
    assert not p.passes(MIN_AGREEMENT, MAX_KL), p


def test_generation_ends_at_endoftext_as_well(ours):
    """The GGUF names one end token, <|im_end|>; the model's generation_config.json (and
    llama.cpp) end at <|endoftext|> too, which the demo model writes after a tool call: it must
    end the reply there instead of text running on past it."""
    tok = ours.tokenizer
    im_end, end_of_text = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    assert set(ours.eos_token_ids) == {im_end, end_of_text}
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    prompt = tok.apply_chat_template([{"role": "user", "content": "What's the weather like in Paris right now?"}],
                                     True, [weather])
    prompt += '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    ids = tok.encode(prompt)
    assert int(np.argmax(ours.logits(ids))) == end_of_text  # what the model writes next
    gen = ours.generate_tokens(ids, max_tokens=20, temperature=0)
    with pytest.raises(StopIteration) as end:
        next(gen)
    assert end.value.value == "stop"
