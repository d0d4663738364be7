"""`qwenc serve` driven by the official openai client over loopback: both endpoints, streamed and
not, stop strings, seeds, logprobs, usage, n > 1, concurrency equal to one-by-one, disconnects
returning their blocks, prefix reuse in cached_tokens, and every error status."""
import concurrent.futures as cf
import json
import math
import os
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import openai
import pytest

import qwenc
from serverutil import LiveServer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def model(text_model_dir):
    return qwenc.load(text_model_dir, context=512)


@pytest.fixture(scope="module")
def live(model):
    srv = LiveServer(model)
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def client(live):
    return live.client()


MSG = [{"role": "user", "content": "Write a haiku about the sea."}]


def alone_chat(model, messages, n, **sampling):
    ids = model.tokenizer.encode(model.tokenizer.apply_chat_template(messages))
    return model.tokenizer.decode(list(model.generate_tokens(ids, max_tokens=n, **sampling)),
                                  skip_special_tokens=True)


# ---------------------------------------------------------------- the happy paths

def test_chat_matches_the_one_sequence_path(client, model, live):
    r = client.chat.completions.create(model=live.model_name, messages=MSG, max_tokens=20, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == live.model_name
    assert r.system_fingerprint and isinstance(r.created, int)
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.index == 0
    assert choice.message.content == alone_chat(model, MSG, 20, temperature=0)
    assert choice.finish_reason in ("length", "stop")
    ids = model.tokenizer.encode(model.tokenizer.apply_chat_template(MSG))
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_chat_stream_equals_non_stream_and_reports_usage(client, live):
    full = client.chat.completions.create(model=live.model_name, messages=MSG, max_tokens=24, temperature=0)
    chunks = list(client.chat.completions.create(model=live.model_name, messages=MSG, max_tokens=24,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)


def test_sse_wire_format_ends_with_done(live):
    with httpx.stream("POST", live.url + "/v1/chat/completions", timeout=60,
                      json={"messages": MSG, "max_tokens": 5, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        json.loads(line[6:])


def test_completions_plain_stream_echo_and_list_prompts(client, model, live):
    prompt = "def quicksort(arr):"
    r = client.completions.create(model=live.model_name, prompt=prompt, max_tokens=16, temperature=0)
    ids = model.tokenizer.encode(prompt)
    want = model.tokenizer.decode(list(model.generate_tokens(ids, max_tokens=16, temperature=0)),
                                  skip_special_tokens=True)
    assert r.object == "text_completion" and r.choices[0].text == want
    s = client.completions.create(model=live.model_name, prompt=prompt, max_tokens=16, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in s if c.choices) == want
    e = client.completions.create(model=live.model_name, prompt=prompt, max_tokens=16, temperature=0, echo=True)
    assert e.choices[0].text == prompt + want
    many = client.completions.create(model=live.model_name, prompt=[prompt, "import os"], max_tokens=4, temperature=0)
    assert [c.index for c in many.choices] == [0, 1] and many.choices[0].text == want[:len(many.choices[0].text)]
    by_ids = client.completions.create(model=live.model_name, prompt=ids, max_tokens=16, temperature=0)
    assert by_ids.choices[0].text == want


def test_stop_strings(client, live):
    full = client.completions.create(model=live.model_name, prompt="Once upon a time", max_tokens=30,
                                     temperature=0).choices[0].text
    stop = full[10:13]
    assert stop.strip(), full
    r = client.completions.create(model=live.model_name, prompt="Once upon a time", max_tokens=30, temperature=0,
                                  stop=[stop, "never-appears"])
    assert r.choices[0].finish_reason == "stop" and r.choices[0].text == full[:full.index(stop)]
    s = client.completions.create(model=live.model_name, prompt="Once upon a time", max_tokens=30, temperature=0,
                                  stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in s if c.choices) == full[:full.index(stop)]


def test_seed_reproducible_and_n(client, live):
    kw = dict(model=live.model_name, messages=MSG, max_tokens=12, temperature=1.0, seed=42)
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert a.choices[0].message.content == b.choices[0].message.content
    c = client.chat.completions.create(**{**kw, "seed": 43})
    d = client.chat.completions.create(**{**kw, "n": 3})
    assert len(d.choices) == 3 and [ch.index for ch in d.choices] == [0, 1, 2]
    assert d.choices[0].message.content == a.choices[0].message.content  # choice 0 keeps the seed
    assert len({ch.message.content for ch in d.choices} | {c.choices[0].message.content}) > 1
    assert d.usage.completion_tokens == sum(
        len(live.engine.model.tokenizer.encode(ch.message.content)) for ch in d.choices) or d.usage.completion_tokens > 0
    streamed = list(client.chat.completions.create(**{**kw, "n": 3, "stream": True}))
    texts = ["".join(ch.choices[0].delta.content or "" for ch in streamed if ch.choices and ch.choices[0].index == i)
             for i in range(3)]
    assert texts == [ch.message.content for ch in d.choices]


def test_chat_logprobs(client, model, live):
    r = client.chat.completions.create(model=live.model_name, messages=MSG, max_tokens=6, temperature=0,
                                       logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    ids = model.tokenizer.encode(model.tokenizer.apply_chat_template(MSG))
    gen = list(model.generate_tokens(ids, max_tokens=6, temperature=0, stop_token_ids=[]))
    # the distribution over real tokens: the padded rows of the vocabulary are never produced
    logits = model.logits(ids + gen, all_positions=True)[:, :model.n_vocab].astype(np.float64)
    for i, entry in enumerate(content):
        row = logits[len(ids) - 1 + i]
        lse = row.max() + math.log(np.exp(row - row.max()).sum())
        assert abs(entry.logprob - (row[gen[i]] - lse)) < 1e-4
        assert bytes(entry.bytes) == model.tokenizer.token_bytes(gen[i])
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert abs(entry.top_logprobs[0].logprob - entry.logprob) < 1e-9  # greedy: the best is the one taken


def test_completions_logprobs_with_echo(client, model, live):
    prompt = "The quick brown fox"
    r = client.completions.create(model=live.model_name, prompt=prompt, max_tokens=3, temperature=0, logprobs=2,
                                  echo=True)
    lp = r.choices[0].logprobs
    ids = model.tokenizer.encode(prompt)
    assert lp.token_logprobs[0] is None and len(lp.tokens) == len(ids) + 3
    assert "".join(lp.tokens[:len(ids)]) == prompt
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert all(len(t) == 2 for t in lp.top_logprobs[1:])


def test_completions_echo_with_max_tokens_zero_scores_the_prompt(client, model, live):
    # how evaluation harnesses score a text: the prompt's own logprobs, nothing generated
    prompt = "The quick brown fox jumps over the lazy dog"
    ids = model.tokenizer.encode(prompt)
    r = client.completions.create(model=live.model_name, prompt=prompt, max_tokens=0, temperature=0, logprobs=1,
                                  echo=True)
    c = r.choices[0]
    assert c.text == prompt and c.finish_reason == "length"
    assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(ids)
    lp = c.logprobs
    assert "".join(lp.tokens) == prompt and len(lp.tokens) == len(ids) and lp.token_logprobs[0] is None
    logits = model.logits(ids, all_positions=True)[:, :model.n_vocab].astype(np.float64)
    for j in range(1, len(ids)):
        row = logits[j - 1]
        want = row[ids[j]] - row.max() - np.log(np.exp(row - row.max()).sum())
        assert abs(lp.token_logprobs[j] - want) < 1e-4
    s = client.completions.create(model=live.model_name, prompt=prompt, max_tokens=0, logprobs=1, echo=True,
                                  stream=True)
    chunks = [ch for ch in s if ch.choices]
    assert "".join(ch.choices[0].text for ch in chunks) == prompt
    assert chunks[-1].choices[0].finish_reason == "length"
    plain = client.completions.create(model=live.model_name, prompt=prompt, max_tokens=0)
    assert plain.choices[0].text == "" and plain.usage.completion_tokens == 0


def test_completions_suffix_fills_the_middle(client, model, live):
    pre, suf = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"
    ids = model.tokenizer.encode(f"<|fim_prefix|>{pre}<|fim_suffix|>{suf}<|fim_middle|>")
    ends = [model.tokenizer.token_to_id(t) for t in ("<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")]
    want = model.tokenizer.decode(list(model.generate_tokens(
        ids, max_tokens=12, temperature=0, stop_token_ids=list(model.eos_token_ids) + ends)))
    r = client.completions.create(model=live.model_name, prompt=pre, suffix=suf, max_tokens=12, temperature=0)
    assert r.choices[0].text == want and r.usage.prompt_tokens == len(ids)
    s = client.completions.create(model=live.model_name, prompt=pre, suffix=suf, max_tokens=12, temperature=0,
                                  stream=True)
    assert "".join(c.choices[0].text for c in s if c.choices) == want
    # the repository markers end a middle, as EOS does; without a suffix they are text like any other
    forced = {str(ends[2]): 100}
    r = client.completions.create(model=live.model_name, prompt=pre, suffix=suf, max_tokens=4, logit_bias=forced)
    assert r.choices[0].text == "" and r.choices[0].finish_reason == "stop"
    r = client.completions.create(model=live.model_name, prompt=pre, max_tokens=4, logit_bias=forced)
    assert r.usage.completion_tokens == 4 and r.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=live.model_name, prompt=pre, suffix=suf, max_tokens=4, echo=True)


def test_concurrent_streams_equal_one_by_one(client, live):
    prompts = [f"Tell me fact number {i} about {topic}." for i, topic in
               enumerate(["cats", "rust", "jazz", "Mars", "tea", "chess", "bees", "rain"])]
    one_by_one = [client.chat.completions.create(model=live.model_name, messages=[{"role": "user", "content": p}],
                                                 max_tokens=24, temperature=0).choices[0].message.content
                  for p in prompts]

    def streamed(p):
        s = client.chat.completions.create(model=live.model_name, messages=[{"role": "user", "content": p}],
                                           max_tokens=24, temperature=0, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in s if c.choices)
    with cf.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(streamed, prompts))
    assert together == one_by_one


def test_disconnect_mid_stream_returns_blocks(live):
    before = live.wait_idle()
    with httpx.stream("POST", live.url + "/v1/chat/completions", timeout=60,
                      json={"messages": MSG, "max_tokens": 460, "stream": True, "ignore_eos": True}) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
        assert live.metrics()['qwenc_kv_blocks{state="used"}'] > 0  # still streaming: blocks held
        lines.close()  # leaving now closes the connection mid-stream
    after = live.wait_idle()
    assert after.get('qwenc_requests_finished_total{reason="cancelled"}', 0) > \
        before.get('qwenc_requests_finished_total{reason="cancelled"}', 0)


def test_prefix_reuse_visible_in_cached_tokens(client, live):
    system = {"role": "system", "content": "You are a meticulous assistant who answers in full sentences. " * 8}
    a = client.chat.completions.create(model=live.model_name, messages=[system, {"role": "user", "content": "Hi."}],
                                       max_tokens=2)
    b = client.chat.completions.create(model=live.model_name, messages=[system, {"role": "user", "content": "Bye."}],
                                       max_tokens=2)
    assert b.usage.prompt_tokens_details.cached_tokens >= 64
    assert b.usage.prompt_tokens_details.cached_tokens <= b.usage.prompt_tokens
    assert live.metrics()["qwenc_cached_prompt_tokens_total"] >= b.usage.prompt_tokens_details.cached_tokens
    assert a.usage.prompt_tokens_details.cached_tokens < b.usage.prompt_tokens_details.cached_tokens


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def test_models_health_metrics_tokenize(live, model):
    r = httpx.get(live.url + "/v1/models").json()
    assert r["object"] == "list" and r["data"][0]["id"] == live.model_name
    assert httpx.get(live.url + f"/v1/models/{live.model_name}").json()["id"] == live.model_name
    assert httpx.get(live.url + "/health").json() == {"status": "ok"}
    m = live.metrics()
    for name in ("qwenc_requests_running", "qwenc_requests_waiting", "qwenc_prompt_tokens_total",
                 "qwenc_generation_tokens_total", 'qwenc_kv_blocks{state="free"}', "qwenc_step_batch_size_count",
                 "qwenc_time_to_first_token_seconds_count", "qwenc_inter_token_latency_seconds_count"):
        assert name in m, name
    t = httpx.post(live.url + "/tokenize", json={"prompt": "hello world"}).json()
    assert t["tokens"] == model.tokenizer.encode("hello world") and t["count"] == len(t["tokens"])
    assert httpx.post(live.url + "/detokenize", json={"tokens": t["tokens"]}).json()["prompt"] == "hello world"
    chat = httpx.post(live.url + "/tokenize", json={"messages": MSG}).json()
    assert chat["tokens"] == model.tokenizer.encode(model.tokenizer.apply_chat_template(MSG))
    # a tool round trip as OpenAI's clients send it: /tokenize counts what the chat request reads
    history = MSG + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 18}'}]
    counted = httpx.post(live.url + "/tokenize", json={"messages": history, "tools": [WEATHER]}).json()["count"]
    used = httpx.post(live.url + "/v1/chat/completions", json={"messages": history, "tools": [WEATHER],
                                                               "max_tokens": 1}).json()["usage"]["prompt_tokens"]
    assert counted == used
    text = httpx.post(live.url + "/detokenize", json={"tokens": httpx.post(
        live.url + "/tokenize", json={"messages": history, "tools": [WEATHER]}).json()["tokens"]}).json()["prompt"]
    assert '"arguments": {"city": "Paris"}' in text and "get_weather" in text.split("<|im_end|>")[0]
    _err(httpx.post(live.url + "/detokenize", json={"tokens": [5, 151700]}), 400)


# ---------------------------------------------------------------- errors

def _err(resp, status):
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert "Traceback" not in resp.text
    return body["error"]


@pytest.mark.parametrize("body,param", [
    ({"messages": MSG, "temperature": -1}, "temperature"),
    ({"messages": MSG, "temperature": "hot"}, "temperature"),
    ({"messages": MSG, "max_tokens": 0}, "max_tokens"),
    ({"messages": MSG, "max_tokens": -5}, "max_tokens"),
    ({"messages": MSG, "n": 100}, "n"),
    ({"messages": MSG, "top_logprobs": 50}, "top_logprobs"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": None}]}, "messages.0"),
    ({"messages": [{"role": "user"}]}, "messages.0"),
    ({"messages": MSG + [{"role": "tool", "tool_call_id": "call_1"}]}, "messages.1"),
    ({"messages": MSG + [{"role": "assistant", "content": None}] + MSG}, "messages.1"),
    ({"messages": MSG, "stop": [""]}, "stop"),
    ({"messages": MSG, "logit_bias": {"abc": 1}}, "logit_bias"),
    ({"messages": MSG, "seed": -1}, "seed"),
    ({}, "messages"),
])
def test_invalid_fields_are_400(live, body, param):
    err = _err(httpx.post(live.url + "/v1/chat/completions", json=body), 400)
    assert err["type"] == "invalid_request_error"
    assert (err["param"] or "").startswith(param), err


def test_malformed_bodies(live):
    url = live.url + "/v1/chat/completions"
    _err(httpx.post(url, content=b"{not json"), 400)
    _err(httpx.post(url, content=b"[1, 2]"), 400)
    _err(httpx.post(url, content=b'{"messages": NaN}'), 400)
    _err(httpx.post(url, content=b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}'), 400)
    _err(httpx.post(url, content=b"[" * 100000 + b"]" * 100000), 400)
    _err(httpx.post(url, json={"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}), 400)


@pytest.mark.parametrize("prompt", [[151700], [15, 151664 + 1], [5, -1], [10 ** 9], [[5], [151935]]])
@pytest.mark.parametrize("echo", [False, True])
def test_prompt_ids_that_are_no_tokens_are_400(live, prompt, echo):
    # 151665-151935 are the embedding's padding rows: ids the vocabulary has no text for
    for stream in (False, True):
        err = _err(httpx.post(live.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2, "echo": echo,
                                                                 "stream": stream}), 400)
        assert "vocabulary" in err["message"]
    ok = httpx.post(live.url + "/v1/completions", json={"prompt": [151664], "max_tokens": 1, "echo": echo})
    assert ok.status_code == 200  # the last real token (<|file_sep|>)


def test_lone_surrogates_are_served(live):
    body = b'{"messages": [{"role": "user", "content": "hi \\ud800 there"}], "max_tokens": 2}'
    r = httpx.post(live.url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


def test_context_length_exceeded(client, live):
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=live.model_name, max_tokens=10,
                                       messages=[{"role": "user", "content": "word " * 2000}])
    assert exc.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=live.model_name, prompt="hi", max_tokens=100_000)


def test_unknown_model_and_route_are_404(client, live):
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="gpt-nonexistent", messages=MSG, max_tokens=2)
    assert exc.value.code == "model_not_found"
    err = _err(httpx.get(live.url + "/v1/nothing-here"), 404)
    assert err["type"] == "not_found_error"
    _err(httpx.get(live.url + "/v1/models/other"), 404)


def test_oversize_body_is_413(live):
    big = {"messages": [{"role": "user", "content": "x" * (9 << 20)}]}
    _err(httpx.post(live.url + "/v1/chat/completions", content=json.dumps(big).encode()), 413)

    def chunks():  # no Content-Length: the limit holds on the bytes that arrive
        for _ in range(10):
            yield b" " * (1 << 20)
    _err(httpx.post(live.url + "/v1/chat/completions", content=chunks()), 413)


def test_api_key(model):
    srv = LiveServer(model, api_key="s3cret", max_batch=2, kv_memory="16MiB")
    try:
        with pytest.raises(openai.AuthenticationError):
            srv.client(api_key="wrong").chat.completions.create(model=srv.model_name, messages=MSG, max_tokens=2)
        _err(httpx.post(srv.url + "/v1/chat/completions", json={"messages": MSG}), 401)
        _err(httpx.get(srv.url + "/v1/models"), 401)
        r = srv.client().chat.completions.create(model=srv.model_name, messages=MSG, max_tokens=2)
        assert r.choices[0].message.content is not None
        assert httpx.get(srv.url + "/health").status_code == 200
    finally:
        srv.close()


def test_full_queue_is_503_with_retry_after(model):
    srv = LiveServer(model, max_batch=1, kv_memory="16MiB", max_queue=2)
    try:
        held = [srv.engine.submit("hello", max_tokens=300, ignore_eos=True)]
        deadline = time.monotonic() + 30
        while srv.engine.snapshot()["running"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(qwenc.QueueFull):  # one running, then fill the queue behind it
            for _ in range(10):
                held.append(srv.engine.submit("hello", max_tokens=300, ignore_eos=True))
        r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": MSG, "max_tokens": 2})
        err = _err(r, 503)
        assert r.headers["retry-after"] == "1" and err["code"] == "overloaded"
        for s in held:
            s.cancel()
        srv.wait_idle()
    finally:
        srv.close()


def test_cors_off_by_default(live):
    r = httpx.options(live.url + "/v1/chat/completions",
                      headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in r.headers


# ---------------------------------------------------------------- the process

def _spawn_serve(model_dir, tmp_path, *args):
    """`qwenc serve` as users run it, on a free port of 127.0.0.1: (process, base url)."""
    port_file = tmp_path / "port"
    env = {**os.environ, "PYTHONPATH": REPO, "QWENC_THREADS": "1"}
    code = ("import sys, qwenc.server as s, qwenc.cli as c;"
            "orig = s.make_server\n"
            "def mk(*a, **k):\n"
            f"    k['ready'] = lambda addr: open({str(port_file)!r}, 'w').write(str(addr[1]))\n"
            "    return orig(*a, **k)\n"
            "s.make_server = mk\n"
            f"sys.exit(c.main(['serve', '-m', {str(model_dir)!r}, '--port', '0', '-q'] + {list(args)!r}))")
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not port_file.exists() or not port_file.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            _, err = proc.communicate(timeout=30)
            raise AssertionError(err.decode())
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{int(port_file.read_text())}"


def test_serve_cli_binds_loopback_and_stops_on_sigterm(text_model_dir, tmp_path):
    """`qwenc serve` as users run it: binds 127.0.0.1, serves, and on SIGTERM lets a running
    stream finish with a proper final chunk, then exits 0."""
    proc, url = _spawn_serve(text_model_dir, tmp_path, "--grace", "20", "--context", "512", "--kv-memory", "32MiB")
    try:
        lines = []
        with httpx.stream("POST", url + "/v1/completions", timeout=60,
                          json={"prompt": "hello", "max_tokens": 60, "stream": True, "ignore_eos": True}) as r:
            for i, line in enumerate(r.iter_lines()):
                if line:
                    lines.append(line)
                if len(lines) == 3:
                    proc.send_signal(signal.SIGTERM)
        assert lines[-1] == "data: [DONE]"
        finals = [json.loads(x[6:])["choices"][0]["finish_reason"] for x in lines[:-1]]
        assert finals[-1] in ("length", "stop") and all(f is None for f in finals[:-1])
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("args, want", [((), 512), (("--context", "300"), 300), (("--kv-memory", "64KiB"), 128),
                                        (("yarn",), 768)])
def test_serve_cli_context_is_the_models_unless_set(text_model_dir, tmp_path, args, want):
    """A served request may use the context the model was trained for (its config's
    max_position_embeddings: 512 here; with YaRN the original context times the factor), within
    the KV memory; --context sets another."""
    model_dir = text_model_dir
    if args == ("yarn",):
        import shutil
        model_dir, args = tmp_path / "yarn", ()
        shutil.copytree(text_model_dir, model_dir)
        cfg = json.loads((model_dir / "config.json").read_text())
        cfg["rope_scaling"] = {"type": "yarn", "factor": 1.5, "original_max_position_embeddings": 512}
        (model_dir / "config.json").write_text(json.dumps(cfg))
    proc, url = _spawn_serve(model_dir, tmp_path, *args)
    try:
        card = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]
        # 64 KiB: 8 blocks of 16 positions (2 layers, K and V, 2 heads of 16 in float32): fewer than 512
        assert card["max_model_len"] == want
        r = httpx.post(url + "/v1/completions", timeout=60,
                       json={"prompt": [5] * (card["max_model_len"] - 4), "max_tokens": 4, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        r = httpx.post(url + "/v1/completions", timeout=60,
                       json={"prompt": [5] * (card["max_model_len"] - 3), "max_tokens": 4})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    finally:
        proc.kill()
        proc.wait(30)


def test_slow_reader_does_not_hold_up_others(live, client):
    """A client that reads its stream very slowly: the engine does not wait for it, and another
    client is served meanwhile."""
    import socket
    host, port = live.url[len("http://"):].split(":")
    body = json.dumps({"messages": MSG, "max_tokens": 200, "stream": True, "ignore_eos": True}).encode()
    s = socket.create_connection((host, int(port)))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    try:
        s.recv(64)  # started; then read nothing for a while
        t0 = time.monotonic()
        r = client.chat.completions.create(model=live.model_name, messages=MSG, max_tokens=8, temperature=0)
        assert r.choices[0].message.content is not None
        assert time.monotonic() - t0 < 30
    finally:
        s.close()
    live.wait_idle()


def test_thousands_of_messages(live):
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": "ok"} for i in range(3000)]
    r = httpx.post(live.url + "/v1/chat/completions", json={"messages": msgs, "max_tokens": 2}, timeout=120)
    err = _err(r, 400)  # rendered and tokenized fine, but far beyond the context
    assert err["code"] == "context_length_exceeded"
    _err(httpx.post(live.url + "/v1/chat/completions", json={"messages": msgs * 2, "max_tokens": 2}), 400)


def test_cors_when_configured(model):
    from qwenc.engine.engine import Engine
    from qwenc.server.app import create_app
    from starlette.testclient import TestClient
    engine = Engine(model, max_batch=1, kv_memory="8MiB")
    try:
        app = create_app(engine, "m", cors_origins=["http://good.example"])
        with TestClient(app) as tc:
            r = tc.options("/v1/chat/completions", headers={"Origin": "http://good.example",
                                                             "Access-Control-Request-Method": "POST"})
            assert r.headers.get("access-control-allow-origin") == "http://good.example"
            r = tc.options("/v1/chat/completions", headers={"Origin": "http://evil.example",
                                                             "Access-Control-Request-Method": "POST"})
            assert r.headers.get("access-control-allow-origin") != "http://evil.example"
    finally:
        engine.shutdown(grace=0)
