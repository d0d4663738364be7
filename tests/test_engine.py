"""The batching engine without HTTP: the block pool's books, the scheduler under random arrivals
and cancellations, and the engine's results against the one-sequence path (the oracle: a
request's tokens must not depend on what it is batched with, chunked with, preempted by or
cached beside)."""
import asyncio
import random
import threading
import time

import numpy as np
import pytest

import qwenc
from qwenc import _ops
from qwenc.engine.engine import Engine, parse_size
from qwenc.engine.kv_pool import BlockPool, OutOfBlocks, block_hashes
from qwenc.engine.scheduler import Scheduler
from qwenc.errors import ContextLengthExceeded, EngineStopped, InvalidRequest, QueueFull

BS = 16


# ---------------------------------------------------------------- the block pool

def test_pool_allocates_releases_and_counts():
    pool = BlockPool(6, BS)
    a = pool.allocate(4)
    assert len(set(a)) == 4 and pool.num_free == 2
    with pytest.raises(OutOfBlocks):
        pool.allocate(3)
    assert pool.num_free == 2  # a failed allocation takes nothing
    pool.release(a[:2])
    assert pool.num_free == 4
    pool.check([a[2:]])
    with pytest.raises(AssertionError):
        pool.release(a[:1])  # released twice


def test_pool_prefix_cache_hits_and_lru_eviction():
    pool = BlockPool(4, BS)
    toks = list(range(3 * BS + 5))
    hashes = block_hashes(toks, BS)
    assert len(hashes) == 3 and len(set(hashes)) == 3
    blocks = pool.allocate(4)
    for b, h in zip(blocks, hashes):
        pool.register(b, h)
    pool.release(blocks)            # all free, three still findable
    assert pool.num_cached == 3 and pool.num_free == 4
    hit = pool.lookup(hashes)
    assert hit == blocks[:3] and pool.num_free == 1
    pool.release(hit)
    # eviction takes the oldest released first: the uncached 4th block, then the chain's tail
    # (release() frees a table back to front, so a prefix's first block is evicted last)
    got = pool.allocate(2)
    assert got[0] == blocks[3] and got[1] == blocks[2]
    assert pool.peek(hashes) == 2 and pool.num_cached == 2
    pool.check([got])


def test_block_hash_chain_depends_on_everything_before():
    a = block_hashes(list(range(2 * BS)), BS)
    b = block_hashes([99] + list(range(1, 2 * BS)), BS)
    assert a[0] != b[0] and a[1] != b[1]  # same second block's tokens, different prefix
    assert block_hashes(list(range(2 * BS)), BS, a[0], 1) == a[1:]


class FakeRequest:
    def __init__(self, n_prompt, max_new, rid):
        self.id = rid
        self.tokens = [random.randrange(50) for _ in range(n_prompt)]
        self.num_prompt = n_prompt
        self.max_new = max_new
        self.num_computed = 0
        self.blocks = []
        self.hashes = block_hashes(self.tokens, BS)
        self.n_registered = 0
        self.cached_tokens = None
        self.prompt_logprobs = False

    def on_preempt(self):
        self.num_computed = 0
        self.n_registered = 0


@pytest.mark.parametrize("seed", range(6))
def test_scheduler_books_balance_under_random_arrivals_and_cancels(seed):
    """Requests arrive, run, finish and get cancelled at random against a pool small enough to
    force preemption; after every step no block is leaked or held twice, and when all is done
    every block is back in the free queue."""
    random.seed(seed)
    pool = BlockPool(24, BS)
    sched = Scheduler(pool, max_batch=5, max_step_tokens=40)
    live, done, next_id = [], 0, 0
    for step in range(400):
        if random.random() < 0.3 and next_id < 60:
            r = FakeRequest(random.randrange(1, 90), random.randrange(1, 60), next_id)
            next_id += 1
            sched.add(r)
            live.append(r)
        if live and random.random() < 0.05:
            victim = random.choice(live)
            sched.remove(victim)
            live.remove(victim)
        plan = sched.schedule()
        ids = [id(c.req) for c in plan]
        assert len(ids) == len(set(ids)), "a request planned twice in one step"
        assert sum(c.n for c in plan) <= sched.max_step_tokens
        for c in plan:
            assert len(c.req.blocks) * BS >= c.start + c.n, "tokens scheduled beyond the blocks held"
            sched.computed(c)
            if c.wants_logits:
                if len(c.req.tokens) - c.req.num_prompt >= c.req.max_new:
                    sched.remove(c.req)
                    live.remove(c.req)
                    done += 1
                else:
                    c.req.tokens.append(random.randrange(50))
        pool.check([r.blocks for r in live])
        if next_id >= 60 and not live:
            break
    for r in list(live):
        sched.remove(r)
    pool.check([])
    assert pool.num_free == pool.num_blocks
    assert done > 10
    if seed == 0:
        assert sched.preemptions > 0, "the pool was meant to be small enough to preempt"


def test_parse_size():
    assert parse_size("1GiB") == 1 << 30 and parse_size("512MiB") == 512 << 20
    assert parse_size("2G") == 2 << 30 and parse_size(12345) == 12345
    for bad in ("lots", "-1G", 0, "", True):
        with pytest.raises(InvalidRequest):
            parse_size(bad)


# ---------------------------------------------------------------- the engine on a real model

@pytest.fixture(scope="module")
def model(text_model_dir):
    return qwenc.load(text_model_dir, context=512)


PROMPTS = ["def fibonacci(n):", "The quick brown fox", "import numpy as np\n", "Once upon a time",
           "SELECT * FROM users WHERE", "class Stack:\n    def __init__(self):", "1, 2, 3, 5, 8,",
           "Translate to French: good morning", "#include <stdio.h>\nint main() {", "Dear Sir or Madam,",
           "x = [i * i for i in", "The mitochondria is", "fn main() {", "<html><body>", "Roses are red,",
           "Q: What is 2+2?\nA:"]


def alone(model, prompt, n, **sampling):
    ids = model.tokenizer.encode(prompt)
    return list(model.generate_tokens(ids, max_tokens=n, **sampling))


@pytest.fixture(scope="module")
def greedy_ref(model):
    return {p: alone(model, p, 12, temperature=0) for p in PROMPTS}


@pytest.mark.parametrize("batch", [1, 2, 4, 16])
def test_batched_greedy_equals_alone(model, greedy_ref, batch):
    with Engine(model, max_batch=batch, kv_memory="64MiB") as engine:
        got = engine.generate(PROMPTS, max_tokens=12, temperature=0)
    for p, c in zip(PROMPTS, got):
        assert c.token_ids == greedy_ref[p], p
        assert c.finish_reason in ("length", "stop")


def test_seeded_sampling_equals_alone(model):
    settings = dict(temperature=1.0, top_p=0.95, top_k=50, seed=1234)
    want = {p: alone(model, p, 10, **settings) for p in PROMPTS[:6]}
    with Engine(model, max_batch=6, kv_memory="64MiB") as engine:
        got = engine.generate(PROMPTS[:6], max_tokens=10, **settings)
    for p, c in zip(PROMPTS[:6], got):
        assert c.token_ids == want[p]
    # and a different seed gives a different draw somewhere (the seed is honoured)
    with Engine(model, max_batch=6, kv_memory="64MiB") as engine:
        other = engine.generate(PROMPTS[:6], max_tokens=10, **{**settings, "seed": 99})
    assert any(a.token_ids != b.token_ids for a, b in zip(got, other))


def test_chunked_prefill_and_mixed_steps_equal_alone(model):
    """A long prompt read in chunks of 7 tokens while short requests decode beside it."""
    long_prompt = " ".join(PROMPTS) * 2
    want_long = alone(model, long_prompt, 8, temperature=0)
    want_short = {p: alone(model, p, 30, temperature=0) for p in PROMPTS[:3]}
    with Engine(model, max_batch=8, kv_memory="64MiB", max_step_tokens=7) as engine:
        shorts = [engine.submit(p, max_tokens=30, temperature=0) for p in PROMPTS[:3]]
        time.sleep(0.05)
        long_req = engine.submit(long_prompt, max_tokens=8, temperature=0)
        assert long_req.result().token_ids == want_long
        for p, s in zip(PROMPTS[:3], shorts):
            assert s.result().token_ids == want_short[p]


def test_prefix_cache_reuse_is_reported_and_exact(model):
    system = "You are a careful assistant. " * 12
    prompts = [system + "Question one?", system + "Question two?"]
    want = [alone(model, p, 6, temperature=0) for p in prompts]
    with Engine(model, max_batch=4, kv_memory="64MiB") as engine:
        first = engine.submit(prompts[0], max_tokens=6, temperature=0).result()
        second = engine.submit(prompts[1], max_tokens=6, temperature=0).result()
        again = engine.submit(prompts[0], max_tokens=6, temperature=0).result()
    assert first.cached_tokens == 0
    n_shared = len(model.tokenizer.encode(system))
    assert second.cached_tokens == (n_shared // BS) * BS > 0
    assert again.cached_tokens == ((first.prompt_tokens - 1) // BS) * BS
    assert [first.token_ids, second.token_ids, again.token_ids] == [want[0], want[1], want[0]]
    assert first.usage["prompt_tokens_details"]["cached_tokens"] == 0


def test_n_copies_of_one_prompt_share_its_prefill(model):
    prompt = "Write a long story about a dragon. " * 6
    with Engine(model, max_batch=4, kv_memory="64MiB") as engine:
        outs = engine.generate([prompt] * 4, max_tokens=4, temperature=0.8, top_k=20)
    cached = sorted(c.cached_tokens for c in outs)
    assert cached[0] == 0 and all(c > 0 for c in cached[1:]), cached


def test_preemption_under_memory_pressure_keeps_results(model):
    """A KV cache of 14 blocks for 8 requests each growing to 2-3 blocks: some are preempted and
    recomputed, and still produce exactly their tokens."""
    want = {p: alone(model, p, 26, temperature=0, stop_token_ids=[]) for p in PROMPTS[:8]}
    cfg = model.config
    block_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * BS * cfg.head_dim * 4
    with Engine(model, max_batch=8, kv_memory=14 * block_bytes, start=False) as engine:
        streams = [engine.submit(p, max_tokens=26, temperature=0, ignore_eos=True) for p in PROMPTS[:8]]
        engine.start()
        got = [s.result() for s in streams]
        assert engine.scheduler.preemptions > 0
        engine.pool.check([])
    for p, c in zip(PROMPTS[:8], got):
        assert c.token_ids == want[p]


def test_streams_concatenate_to_the_result_and_stop_strings(model):
    with Engine(model, max_batch=4, kv_memory="64MiB") as engine:
        pieces, final = [], None
        for out in engine.submit(PROMPTS[0], max_tokens=30, temperature=0):
            pieces.append(out.text)
            final = out
        full = engine.submit(PROMPTS[0], max_tokens=30, temperature=0).result()
        assert "".join(pieces) == full.text and final.finish_reason == full.finish_reason
        text = model.generate(PROMPTS[0], max_tokens=30, temperature=0)
        assert full.text == text
        stop = text[len(text) // 2:len(text) // 2 + 2]
        cut = engine.submit(PROMPTS[0], max_tokens=30, temperature=0, stop=[stop]).result()
        assert cut.finish_reason == "stop" and cut.text == text[:text.index(stop)]


def test_logprobs_match_log_softmax_of_the_logits(model):
    ids = model.tokenizer.encode(PROMPTS[1])
    with Engine(model, max_batch=2, kv_memory="64MiB") as engine:
        c = engine.submit(ids, max_tokens=3, temperature=0, logprobs=True, top_logprobs=5,
                          prompt_logprobs=True).result()
    seq = ids + c.token_ids
    logits = model.logits(seq, all_positions=True)[:, :model.n_vocab].astype(np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - \
        logits.max(-1, keepdims=True)
    for i, lp in enumerate(c.logprobs):
        row = logp[len(ids) - 1 + i]
        assert lp.token == c.token_ids[i]
        assert abs(lp.logprob - row[lp.token]) < 1e-4
        assert [t for t, _ in lp.top] == list(np.argsort(-row, kind="stable")[:5])
        assert lp.top[0][0] == lp.token  # greedy: the sampled token is the most likely
    assert c.prompt_logprobs[0].logprob is None and len(c.prompt_logprobs) == len(ids)
    for j in range(1, len(ids)):
        assert abs(c.prompt_logprobs[j].logprob - logp[j - 1][ids[j]]) < 1e-4


def test_max_tokens_zero_scores_the_prompt_and_generates_nothing(model):
    ids = model.tokenizer.encode(PROMPTS[1])
    with Engine(model, max_batch=2, kv_memory="64MiB") as engine:
        one = engine.submit(ids, max_tokens=1, temperature=0, prompt_logprobs=True, logprobs=True).result()
        zero = engine.submit(ids, max_tokens=0, temperature=0, prompt_logprobs=True, logprobs=True).result()
        bare = engine.submit(ids, max_tokens=0, temperature=0).result()
        streamed = list(engine.submit(ids, max_tokens=0, temperature=0, prompt_logprobs=True))
        assert engine.pool.num_used == 0
    for c in (zero, bare):
        assert c.text == "" and c.token_ids == [] and c.finish_reason == "length"
        assert c.usage["completion_tokens"] == 0 and c.usage["prompt_tokens"] == len(ids)
    assert not zero.logprobs
    assert [(p.token, p.logprob) for p in zero.prompt_logprobs] == [(p.token, p.logprob) for p in one.prompt_logprobs]
    assert len(streamed) == 1 and streamed[0].finish_reason == "length" and streamed[0].text == ""
    assert [p.token for p in streamed[0].prompt_logprobs] == ids


def test_chat_history_with_openai_tool_calls_reads_as_objects(model):
    # OpenAI sends a call's arguments as a JSON string; Qwen's template wants the object (it would
    # quote the string again): the engine reads messages as the chat path does
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "c1", "content": "18 C"}]
    as_object = [history[0], {**history[1], "tool_calls": [
        {**call, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}, history[2]]
    want = model.tokenizer.encode(model.tokenizer.apply_chat_template(as_object))
    assert model.tokenizer.encode(model.tokenizer.apply_chat_template(history)) != want  # the template quotes it
    with Engine(model, max_batch=2, kv_memory="16MiB") as engine:
        assert engine.submit(history, max_tokens=0).prompt_ids == want


def test_break_cancels_and_returns_blocks(model):
    with Engine(model, max_batch=4, kv_memory="64MiB") as engine:
        stream = engine.submit(PROMPTS[2], max_tokens=200, temperature=0, ignore_eos=True)
        for i, out in enumerate(stream):
            if i == 3:
                break
        deadline = time.monotonic() + 5
        while engine.pool.num_used and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.pool.num_used == 0
        assert engine.snapshot()["running"] == 0
        engine.pool.check([])


def test_async_streams_and_cancel(model, greedy_ref):
    async def main(engine):
        async def one(p):
            return "".join([o.text async for o in engine.submit(p, max_tokens=12, temperature=0)])
        texts = await asyncio.gather(*(one(p) for p in PROMPTS[:5]))
        agen = engine.submit(PROMPTS[0], max_tokens=300, temperature=0, ignore_eos=True).__aiter__()
        await agen.__anext__()
        await agen.aclose()  # what a server does when its client disconnects
        return texts

    with Engine(model, max_batch=8, kv_memory="64MiB") as engine:
        texts = asyncio.run(main(engine))
        deadline = time.monotonic() + 5
        while engine.pool.num_used and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.pool.num_used == 0
    for p, t in zip(PROMPTS[:5], texts):
        assert t == model.tokenizer.decode(greedy_ref[p], skip_special_tokens=True) or t


def test_submit_errors_come_at_once(model):
    with Engine(model, max_batch=2, kv_memory="8MiB", max_queue=3) as engine:
        with pytest.raises(ContextLengthExceeded):
            engine.submit("hello " * 600, max_tokens=10)
        with pytest.raises(ContextLengthExceeded):
            engine.submit("hello", max_tokens=10_000)
        for bad in (dict(temperature=-1), dict(top_p=0), dict(seed=-3), dict(seed="x"),
                    dict(presence_penalty=3), dict(logit_bias={"abc": 1}), dict(logit_bias={"5": 500}),
                    dict(max_tokens=-1), dict(top_logprobs=21), dict(stop=[""]), dict(bogus=1)):
            with pytest.raises(InvalidRequest):
                engine.submit("hello", **bad)
        with pytest.raises(InvalidRequest):
            engine.submit([151936 + 5], max_tokens=1)
        with pytest.raises(InvalidRequest):
            engine.submit("", max_tokens=1)
        streams = []
        with pytest.raises(QueueFull):
            for _ in range(50):
                streams.append(engine.submit("hello", max_tokens=50, ignore_eos=True))
        for s in streams:
            s.cancel()
    with pytest.raises(EngineStopped):
        engine.submit("hello", max_tokens=1)


def test_logit_bias_and_penalties_steer(model):
    ids = model.tokenizer.encode(PROMPTS[3])
    target = 1000
    with Engine(model, max_batch=2, kv_memory="64MiB") as engine:
        c = engine.submit(ids, max_tokens=4, temperature=0, logit_bias={str(target): 100}).result()
        assert c.token_ids == [target] * 4
        c = engine.submit(ids, max_tokens=4, temperature=0, logit_bias={str(target): 100},
                          frequency_penalty=2.0, presence_penalty=2.0).result()
        assert c.token_ids[0] == target  # the penalties only count generated tokens


def test_shutdown_grace_ends_running_requests(model):
    engine = Engine(model, max_batch=2, kv_memory="64MiB")
    it = iter(engine.submit(PROMPTS[0], max_tokens=400, temperature=0, ignore_eos=True))
    next(it)
    engine.shutdown(grace=0.2)
    assert not engine.alive
    outs = list(it)  # the stream still ends properly, cut short
    assert outs[-1].finish_reason == "length" and outs[-1].completion_tokens < 400


# ---------------------------------------------------------------- threads

def test_threads_setting_holds_in_other_threads(text_model_dir):
    qwenc.load(text_model_dir, threads=1)
    width = []
    t = threading.Thread(target=lambda: width.append(_ops.parallel_width()))
    t.start()
    t.join()
    assert width == [1]


def test_two_threads_sharing_one_model(model, greedy_ref):
    results = {}

    def work(p):
        results[p] = alone(model, p, 12, temperature=0)

    threads = [threading.Thread(target=work, args=(p,)) for p in PROMPTS[:6]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in PROMPTS[:6]:
        assert results[p] == greedy_ref[p]


def test_request_sequence_follows_its_blocks_after_preemption(model):
    """After a preemption a request may come back with as many blocks as before but other ones:
    the forward pass must see the new table."""
    with Engine(model, max_batch=2, kv_memory="8MiB", start=False) as engine:
        engine.submit("hello there", max_tokens=1)
        req = engine._inbox[0]
        req.blocks = [1, 2]
        req.sync_sequence()
        req.on_preempt()
        req.blocks = [5, 3]
        req.sync_sequence()
        assert list(req.seq.block_table) == [5, 3]
        req.blocks = []  # they were never the pool's


# ---------------------------------------------------------------- cancelling the one-sequence path

def test_generation_cancel_stops_a_long_prefill_between_chunks(model):
    from qwenc import Generation
    ids = model.tokenizer.encode("lorem ipsum " * 400)[:500]
    long_model = qwenc.load(model.source, context=120_000)
    gen = Generation(long_model, ids * 200, max_tokens=5)
    t = threading.Timer(0.5, gen.cancel)
    t.start()
    t0 = time.monotonic()
    assert gen.run() == ""
    assert gen.finish_reason == "cancelled"
    assert time.monotonic() - t0 < 10  # 100,000 prompt tokens would take far longer
    t.cancel()


def test_real_model_cli_gen_ctrl_c_during_a_long_prefill_exits_within_a_second(demo_gguf, tmp_path):
    """The real model's prefill runs in chunks of 512 tokens of several seconds each, every chunk
    one C call: Ctrl-C must not wait for the chunk to end."""
    import os
    import signal
    import subprocess
    import sys
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("The history of the city, told street by street. " * 350)  # ~3,500 tokens
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": repo}
    with open(prompt) as stdin:
        p = subprocess.Popen([sys.executable, "-m", "qwenc", "gen", "-m", demo_gguf, "--context", "4096",
                              "-n", "5", "-"], stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        time.sleep(5.0)
        assert p.poll() is None, "finished before the interrupt: the prefill was meant to take longer"
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        code = p.wait(10)
        took = time.monotonic() - t0
        err = p.stderr.read().decode()
    finally:  # a failed check must not leave the process running
        if p.poll() is None:
            p.kill()
            p.wait()
    assert code == 130 and "interrupted" in err and "Traceback" not in err, err
    assert took < 1.0, f"took {took:.2f} s to stop"


# ---------------------------------------------------------------- constraints in the engine

def test_constrained_requests_batched_equal_alone_and_validate(model):
    import json
    import jsonschema
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999},
                                               "w": {"type": "string", "maxLength": 6}},
              "required": ["n", "w"], "additionalProperties": False}
    spec = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    prompts = PROMPTS[:6]
    want = [qwenc.Generation(model, model.tokenizer.encode(p), max_tokens=60, constraint=spec, temperature=1.0,
                             seed=i).run() for i, p in enumerate(prompts)]
    with Engine(model, max_batch=6, kv_memory="64MiB", start=False) as engine:
        streams = [engine.submit(p, max_tokens=60, constraint=spec, temperature=1.0, seed=i)
                   for i, p in enumerate(prompts)]
        plain = engine.submit(PROMPTS[7], max_tokens=10, temperature=0)  # an unconstrained row beside
        engine.start()
        got = [s.result() for s in streams]
        assert plain.result().token_ids == alone(model, PROMPTS[7], 10, temperature=0)
    assert [c.text for c in got] == want
    for c in got:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.text), schema)
    with pytest.raises(InvalidRequest):
        Engine(model, max_batch=1, kv_memory="8MiB").submit("x", constraint={"type": "regex", "regex": "(("})
