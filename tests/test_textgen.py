"""Text generation end to end on a random-weight model that carries Qwen's real tokenizer:
streaming vs non-streaming, stop strings, EOS, max_tokens, generation_config defaults, the
OpenAI-shaped chat API, KV reuse across chat turns, and the CLI (`qwenc gen`, `qwenc chat`)."""
import json
import re
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import qwenc
from qwenc import _ops
from modelgen import make_model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def model_dir(qwen_tokenizer_dir, tmp_path_factory):
    path, _ = make_model(tmp_path_factory.mktemp("textmodel"), arch="qwen2", dtype="bf16", vocab_size=151936,
                         hidden_size=64, num_attention_heads=4, num_key_value_heads=2, seed=3)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(qwen_tokenizer_dir / name, path / name)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [151643, 151645]}))
    return path


@pytest.fixture(scope="module")
def model(model_dir):
    return qwenc.load(model_dir, context=2048)


GREEDY = dict(temperature=0)


def test_stream_equals_generate_equals_decode(model):
    prompt = "def fibonacci(n):"
    text = model.generate(prompt, max_tokens=40, **GREEDY)
    pieces = list(model.stream(prompt, max_tokens=40, **GREEDY))
    assert "".join(pieces) == text and len(pieces) > 1
    ids = list(model.generate_tokens(model.tokenizer.encode(prompt), max_tokens=40, **GREEDY))
    assert text == model.tokenizer.decode(ids, skip_special_tokens=True)


def test_stop_string_spanning_tokens_is_never_emitted(model):
    prompt = "Once upon a time"
    full = model.generate(prompt, max_tokens=60, **GREEDY)
    assert len(full) > 20
    stop = full[len(full) // 2: len(full) // 2 + 5]
    expected = full[:full.find(stop)]
    from qwenc.engine.generate import Generation
    gen = Generation(model, model.tokenizer.encode(prompt), max_tokens=60, stop=[stop], **GREEDY)
    pieces = list(gen)
    assert "".join(pieces) == expected
    assert gen.finish_reason == "stop"
    assert all(stop not in p for p in pieces)


def test_eos_and_max_tokens_finish_reasons(model):
    from qwenc.engine.generate import Generation
    ids = model.tokenizer.encode("hello")
    free = list(model.generate_tokens(ids, max_tokens=10, **GREEDY))
    gen = Generation(model, ids, max_tokens=10, stop_token_ids=[free[4]], **GREEDY)
    gen.run()
    assert gen.finish_reason == "stop" and gen.token_ids == free[:free.index(free[4])]
    gen = Generation(model, ids, max_tokens=7, stop_token_ids=[], **GREEDY)
    gen.run()
    assert gen.finish_reason == "length" and gen.completion_tokens == 7


def test_generation_config_defaults_and_overrides(model_dir, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(model_dir, d)
    (d / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [151643, 151645], "do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
         "repetition_penalty": 1.05}))
    m = qwenc.load(d)
    p = m.sampling_params()
    assert (p.temperature, p.top_p, p.top_k, p.repetition_penalty) == (0.7, 0.8, 20, 1.05)
    assert m.sampling_params(temperature=0, top_k=5).temperature == 0
    assert {151643, 151645} <= set(m.eos_token_ids)
    with pytest.raises(ValueError, match="top_p"):
        m.generate("x", top_p=0)


def test_seeded_sampling_is_reproducible(model):
    a = model.generate("x", max_tokens=20, temperature=1.0, seed=7)
    b = model.generate("x", max_tokens=20, temperature=1.0, seed=7)
    c = model.generate("x", max_tokens=20, temperature=1.0, seed=8)
    assert a == b and a != c


def test_chat_completion_shapes(model):
    messages = [{"role": "user", "content": "Write a haiku about CPUs."}]
    out = model.chat(messages, max_tokens=16, **GREEDY)
    assert out["object"] == "chat.completion"
    choice = out["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] in ("stop", "length")
    rendered = model.tokenizer.apply_chat_template(messages)
    assert rendered.endswith("<|im_start|>assistant\n") and "<|im_start|>user\nWrite a haiku" in rendered
    assert choice["message"]["content"] == model.generate(rendered, max_tokens=16, **GREEDY)
    assert out["usage"]["prompt_tokens"] == len(model.tokenizer.encode(rendered))
    chunks = list(model.chat(messages, stream=True, max_tokens=16, **GREEDY))
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == choice["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]
    assert chunks[-1]["usage"] == out["usage"]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)


def test_chat_logprobs_are_the_models_log_softmax(model):
    messages = [{"role": "user", "content": "Count to five."}]
    out = model.chat(messages, max_tokens=8, logprobs=True, top_logprobs=3, **GREEDY)
    content = out["choices"][0]["logprobs"]["content"]
    ids = model.tokenizer.encode(model.tokenizer.apply_chat_template(messages))
    gen = [model.tokenizer.encode(e["token"]) for e in content]  # each a token of Qwen's vocabulary
    assert len(content) == out["usage"]["completion_tokens"]
    toks = [t[0] for t in gen]
    assert all(len(t) == 1 for t in gen) and "".join(e["token"] for e in content) == \
        out["choices"][0]["message"]["content"]
    logits = model.logits(ids + toks, all_positions=True)[:, :model.n_vocab].astype(np.float64)
    for i, e in enumerate(content):
        row = logits[len(ids) - 1 + i]
        lse = row.max() + np.log(np.exp(row - row.max()).sum())
        assert abs(e["logprob"] - (row[toks[i]] - lse)) < 1e-4
        assert bytes(e["bytes"]) == model.tokenizer.token_bytes(toks[i])
        assert [t["logprob"] for t in e["top_logprobs"]] == sorted((t["logprob"] for t in e["top_logprobs"]),
                                                                   reverse=True)
        assert len(e["top_logprobs"]) == 3 and e["top_logprobs"][0]["token"] == e["token"]  # greedy
    chunks = list(model.chat(messages, max_tokens=8, logprobs=True, top_logprobs=3, stream=True, **GREEDY))
    streamed = [e for c in chunks if c["choices"][0]["logprobs"] for e in c["choices"][0]["logprobs"]["content"]]
    assert streamed == content
    assert model.chat(messages, max_tokens=2, **GREEDY)["choices"][0]["logprobs"] is None


def test_chat_takes_openais_penalties_and_refuses_what_it_cannot_serve(model):
    from qwenc.engine.engine import Engine
    messages = [{"role": "user", "content": "Say something."}]
    ids = model.tokenizer.encode(model.tokenizer.apply_chat_template(messages))
    settings = dict(presence_penalty=1.5, frequency_penalty=0.5, logit_bias={str(ids[-1]): -100, "11": 5})
    text = model.chat(messages, max_tokens=12, **settings, **GREEDY)["choices"][0]["message"]["content"]
    plain = model.chat(messages, max_tokens=12, **GREEDY)["choices"][0]["message"]["content"]
    with Engine(model, max_batch=2, kv_memory="16MiB") as engine:
        assert engine.submit(messages, max_tokens=12, **settings, **GREEDY).result().text == text
        assert engine.submit("Hello", max_tokens=12, frequency_penalty=2.0, **GREEDY).result().text == \
            model.generate("Hello", max_tokens=12, frequency_penalty=2.0, **GREEDY)
    assert text != plain  # the settings are applied, not handed to the chat template
    for bad in (dict(n=2), dict(stream_options={"include_usage": True}), dict(presence_penalty=3),
                dict(logit_bias={"x": 1}), dict(top_logprobs=21)):
        with pytest.raises(qwenc.InvalidRequest):
            model.chat(messages, max_tokens=2, **bad)
    assert model.chat(messages, max_completion_tokens=3, max_tokens=9, **GREEDY)["usage"]["completion_tokens"] == 3


def test_chat_session_reuses_the_cache(model, monkeypatch):
    from qwenc.engine.generate import ChatSession, Generation, render_chat
    session = ChatSession(model, max_tokens=12, **GREEDY)
    g = session.send("Hello there")
    first = g.run()
    cached = session.cached_tokens
    cached_ids = list(session.sequence.tokens)
    first_prompt = model.tokenizer.encode(render_chat(model, [{"role": "user", "content": "Hello there"}]))
    prefilled = []
    real_forward = model.forward

    def counting_forward(seq, ids, all_positions=False, **kwargs):
        prefilled.append(len(ids))
        return real_forward(seq, ids, all_positions, **kwargs)

    monkeypatch.setattr(model, "forward", counting_forward)
    second = session.send("And again?").run()
    monkeypatch.undo()
    history = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": first},
               {"role": "user", "content": "And again?"}]
    full_prompt = model.tokenizer.encode(render_chat(model, history))
    # The first turn's prompt and reply are cached; a reply cut by max_tokens lacks its last token,
    # which was never fed back.
    assert len(g.token_ids) > 0
    assert cached == len(first_prompt) + len(g.token_ids) - (g.finish_reason == "length")
    # The second turn prefills exactly what the cache lacks: the prompt past the longest common
    # prefix, which takes in the whole first prompt.
    common = 0
    while common < min(len(cached_ids), len(full_prompt)) and cached_ids[common] == full_prompt[common]:
        common += 1
    assert common >= len(first_prompt), "the second turn re-prefilled the first"
    assert prefilled[0] == len(full_prompt) - common
    assert second == Generation(model, full_prompt, max_tokens=12, **GREEDY).run()
    session.reset()
    assert session.cached_tokens == 0 and session.messages == []


# ---------------------------------------------------------------- CLI

def run_cli(*args, input=None, timeout=120):
    """Run the CLI; stdout/stderr decoded as UTF-8 without newline translation (answers may hold \r)."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), PYTHONIOENCODING="utf-8")
    r = subprocess.run([sys.executable, "-m", "qwenc", *args], input=input.encode() if input else None,
                       capture_output=True, timeout=timeout, env=env)
    r.stdout, r.stderr = r.stdout.decode("utf-8"), r.stderr.decode("utf-8")
    return r


def test_cli_gen_streams_the_same_text(model, model_dir):
    r = run_cli("gen", "-m", str(model_dir), "--temperature", "0", "-n", "12", "def add(a, b):")
    assert r.returncode == 0, r.stderr
    assert r.stdout == model.generate("def add(a, b):", max_tokens=12, **GREEDY) + "\n"
    assert "tok/s" in r.stderr and "prefill" in r.stderr


def test_cli_gen_dtype_and_activations(model_dir):
    """--dtype and --activations reach qwenc.load: the CLI's text equals the API's for the same
    modes, and an unknown mode is refused by argparse."""
    import qwenc
    m = qwenc.load(model_dir, dtype="q8_0", activations="int8")
    r = run_cli("gen", "-m", str(model_dir), "--dtype", "q8_0", "--activations", "int8",
                "--temperature", "0", "-n", "10", "def add(a, b):")
    assert r.returncode == 0, r.stderr
    assert r.stdout == m.generate("def add(a, b):", max_tokens=10, **GREEDY) + "\n"
    r = run_cli("gen", "-m", str(model_dir), "--activations", "int4", "hi")
    assert r.returncode == 2 and "int4" in r.stderr


def test_cli_default_activations_are_the_apis():
    """Every command that loads a model runs in the mode qwenc.load() runs in by default: a
    server or `gen` must not quietly use another arithmetic than the Python API."""
    import inspect
    import qwenc
    from qwenc.cli import build_parser
    params = inspect.signature(qwenc.load).parameters
    ap = build_parser()
    for argv in (["gen", "hi"], ["chat"], ["serve"], ["bench"]):
        assert ap.parse_args(argv).activations == params["activations"].default, argv
        assert ap.parse_args(argv).kv_cache == params["kv_cache"].default, argv


def test_kv_cache_choice(model_dir):
    """kv_cache="auto" keeps float32 where the arithmetic is exact (float weights, or f32
    activations) and half precision on the integer path; an explicit choice holds either way,
    and a float16 cache takes half the bytes a block of the engine's pool takes."""
    import qwenc
    from qwenc.model import KVCache
    m = qwenc.load(model_dir)                          # float weights: exact, whatever activations says
    assert m.transformer.kv_dtype == "f32"
    assert m.new_sequence(20).cache.k[0].dtype == np.float32
    m16 = qwenc.load(model_dir, kv_cache="f16")
    seq = m16.new_sequence(40)
    assert seq.cache.k[0].dtype == np.float16 and seq.cache.v[0].dtype == np.float16
    assert KVCache.block_bytes(m.config, dtype="f16") * 2 == KVCache.block_bytes(m.config, dtype="f32")
    ids = m.tokenizer.encode("def add(a, b):\n    return")
    a, b = m.logits(ids), m16.logits(ids)
    assert np.abs(a - b).max() < 5e-2 and not np.array_equal(a, b)  # close, and really rounded
    with pytest.raises(qwenc.InvalidRequest):
        qwenc.load(model_dir, kv_cache="int8")
    r = run_cli("gen", "-m", str(model_dir), "--kv-cache", "f16", "--temperature", "0", "-n", "4", "hi")
    assert r.returncode == 0, r.stderr
    r = run_cli("gen", "-m", str(model_dir), "--kv-cache", "bf16", "hi")
    assert r.returncode == 2 and "bf16" in r.stderr


def test_cli_gen_chat_flag_and_errors(model, model_dir):
    r = run_cli("gen", "-m", str(model_dir), "--chat", "--temperature", "0", "-n", "8", "hi")
    assert r.returncode == 0, r.stderr
    rendered = model.chat_template.render([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert r.stdout == model.generate(rendered, max_tokens=8, **GREEDY) + "\n"
    r = run_cli("gen", "-m", str(model_dir), "--top-p", "7", "hi")
    assert r.returncode == 2 and "top_p" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("gen", "-m", "/nonexistent/model", "hi")
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_cli_chat_piped_multi_turn_and_reset(model, model_dir):
    from qwenc.engine.generate import ChatSession
    r = run_cli("chat", "-m", str(model_dir), "--temperature", "0", "-n", "6",
                input="Hello\nHow are you?\n/reset\nHello\n")
    assert r.returncode == 0, r.stderr
    session = ChatSession(model, max_tokens=6, **GREEDY)
    first, second = session.send("Hello").run(), session.send("How are you?").run()
    assert r.stdout == f"{first}\n{second}\n{first}\n", "history kept across turns, cleared by /reset"
    assert "[conversation cleared]" in r.stderr
    assert r.stderr.count("[prefill") == 3
    assert "cached" in r.stderr.split("[conversation cleared]")[0], "turn 2 reused turn 1's cache"


def test_cli_chat_ctrl_c_stops_the_answer_not_the_session(model_dir):
    """Two long answers, each stopped by SIGINT (Ctrl-C); the session survives both."""
    import threading
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), PYTHONIOENCODING="utf-8")
    p = subprocess.Popen([sys.executable, "-m", "qwenc", "chat", "-m", str(model_dir), "--temperature", "0",
                          "-n", "100000", "--context", "200000"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out = bytearray()
    drain = threading.Thread(target=lambda: [out.extend(chunk) for chunk in iter(lambda: p.stdout.read1(4096), b"")],
                             daemon=True)
    drain.start()

    def interrupt_after_output():
        start = len(out)
        deadline = time.time() + 60
        while time.time() < deadline and len(out) < start + 50:
            time.sleep(0.1)
        assert len(out) >= start + 50, "no streamed output before the interrupt"
        p.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert p.poll() is None, "Ctrl-C killed the session"

    try:
        for message in (b"Tell me a long story\n", b"Another one\n"):
            p.stdin.write(message)
            p.stdin.flush()
            interrupt_after_output()
        p.stdin.write(b"/exit\n")
        p.stdin.close()
        assert p.wait(timeout=60) == 0
        err = p.stderr.read().decode()
        assert err.count("interrupted") == 2 and "Traceback" not in err
    finally:
        if p.poll() is None:
            p.kill()


def test_cli_bench_reports_speeds_and_roofline(model_dir):
    r = run_cli("bench", "-m", str(model_dir), "-p", "8", "-n", "4", "-d", "20", "-b", "1,3", "--batch-steps", "2",
                "-r", "2")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("| model | size | params | mode | threads | test | t/s |")
    tests = [line.split("|")[6].strip() for line in lines[2:] if line.startswith("| ")]
    assert tests == ["pp8", "tg4", "tg4 @ d20", "tg2 x B=1", "tg2 x B=3"], tests
    for line in lines[2:2 + len(tests)]:
        mean, sd = line.split("|")[7].split("±")
        assert float(mean) > 0 and float(sd) >= 0
    assert "% of the roofline" in r.stdout and "peak RSS" in r.stdout
    assert "of that peak" not in r.stdout  # bf16 weights: float products, no integer peak to compare


def test_cli_bench_reports_integer_products_against_their_peak(model_dir):
    """In the integer modes the prefill and the largest batch are set against the integer
    products' measured peak, with the byte multiply-adds per token counted from the model: every
    matrix's weights times the act levels (2 for int16, 1 for int8), the head once per token in
    a batch and once per prompt in a prefill."""
    r = run_cli("bench", "-m", str(model_dir), "--dtype", "q8_0", "--modes", "int16,int8", "-p", "8", "-n", "2",
                "-d", "0", "-b", "1,3", "--batch-steps", "2", "-r", "1")
    assert r.returncode == 0, r.stderr
    model = qwenc.load(model_dir, dtype="q8_0", activations="int8")
    w = model.weights
    head = w.head.weight.shape[0] * w.head.weight.shape[1]
    body = sum(lin.weight.shape[0] * lin.weight.shape[1] for lin in w.linears()) - head
    assert re.search(r"integer products' peak \d+ G byte multiply-adds/s", r.stdout), r.stdout
    found = {}
    for m in re.finditer(r"^(\S+(?: x B=\d+)?) \((int16|int8)\): [\d.]+ tok/s x ([\d.e-]+) G per token = \d+% of that peak$",
                         r.stdout, re.M):
        found[(m.group(1), m.group(2))] = float(m.group(3)) * 1e9
    for mode, levels in (("int16", 2), ("int8", 1)):
        assert found[("pp8", mode)] == pytest.approx(levels * (body + head / 8), rel=0.006)
        assert found[("tg2 x B=3", mode)] == pytest.approx(levels * (body + head), rel=0.006)
    assert len(found) == 4, r.stdout
    # on AVX2 the int16 tests on vertical blocks (6-8 or 11 or more rows) are also set against the
    # 16-bit probe, one multiply-add per weight and act row: the 8-token prefill, not the batch of 3
    words = re.findall(r"^(\S+(?: x B=\d+)?) \((int16|int8)\): [\d.]+ tok/s x ([\d.e-]+) G 16-bit per token = "
                       r"\d+% of the 16-bit peak$", r.stdout, re.M)
    if _ops.simd_path() == "avx2":
        assert re.search(r"16-bit multiply-adds' peak \d+ G/s", r.stdout), r.stdout
        assert [(t, m) for t, m, _ in words] == [("pp8", "int16")], r.stdout
        assert float(words[0][2]) * 1e9 == pytest.approx(body + head / 8, rel=0.006)
    else:
        assert not words and "16-bit multiply-adds' peak" not in r.stdout, r.stdout


def test_int_products_per_token_counts_integer_path_weights(model_dir):
    """Exact counts: each integer-path matrix's weights times the act levels; nothing in the
    float mode, nor for matrices the float path computes (bf16 weights)."""
    from qwenc.bench import int_products_per_token
    m16 = qwenc.load(model_dir, dtype="q8_0", activations="int16")
    w = m16.weights
    sizes = [lin.weight.shape[0] * lin.weight.shape[1] for lin in w.linears()]
    head = w.head.weight.shape[0] * w.head.weight.shape[1]
    assert int_products_per_token(m16) == 2 * sum(sizes)
    assert int_products_per_token(m16, 1 / 4) == 2 * (sum(sizes) - head + head / 4)
    assert int_products_per_token(qwenc.load(model_dir, dtype="q8_0", activations="int8")) == sum(sizes)
    assert int_products_per_token(qwenc.load(model_dir, dtype="q8_0", activations="f32")) == 0
    assert int_products_per_token(qwenc.load(model_dir, activations="int16")) == 0  # bf16: float path
