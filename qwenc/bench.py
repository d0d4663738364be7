"""Prefill and decode throughput of a loaded model, and how each compares to its roofline.

Decode reads every weight matrix once per token (the embedding only one row), so its speed limit
is memory bandwidth / bytes read per token. `weight_bytes_per_token` counts those bytes and
`measure_bandwidth` measures the machine's read bandwidth with the same threads, so the report
can say what share of the roofline a run reaches.

Prefill and batched decode reuse each weight across many act rows, so their limit is arithmetic:
in the integer modes, one byte multiply-add per weight and act level (two levels for int16, one
for int8). `int_products_per_token` counts those and `measure_dot_peak` times the integer
kernels' own instruction on every thread, so the report says what share of that peak they reach.
"""
import statistics
import time

import numpy as np

from . import _ops
from .formats.tensors import row_bytes


def weight_bytes_per_token(model) -> int:
    w, cfg = model.weights, model.config
    total = 0
    for lin, share in w.linears_per_token():  # the copy the products read (repacked, in the integer modes)
        total += (lin.packed if lin.packed is not None else lin.weight).data.nbytes * share
    if w.lm_head is not w.embed:
        total += row_bytes(w.embed.dtype, cfg.hidden_size)
    return int(total)


def measure_bandwidth(mb: int = 1024, repeats: int = 5) -> float:
    """Read bandwidth in GB/s: the best of `repeats` streaming reads of `mb` MB by all the
    kernels' threads, after one warm-up pass. Far larger than the caches, so it is DRAM speed:
    what a decode step could at best read its weights at. A plain sum of 64-bit words, not a
    model kernel: a kernel as the probe would be bound by its own arithmetic, and faster kernels
    would show above 100% of it."""
    words = np.ones(mb * (1 << 20) // 8, np.uint64)
    times = []
    if _ops.read_sum(words) != words.size:
        raise RuntimeError("bandwidth probe: wrong sum")
    for _ in range(repeats):
        t = time.perf_counter()
        _ops.read_sum(words)
        times.append(time.perf_counter() - t)
    return words.nbytes / min(times) / 1e9


def measure_dot_peak(seconds: float = 0.2, repeats: int = 5, words: bool = False) -> float:
    """The integer products' peak in G byte multiply-adds per second: the best of `repeats` runs
    of the current path's multiply-add instruction (512- or 256-bit vpdpbusd, AVX2's vpmaddubsw,
    plain C) in independent chains on all the kernels' threads, each run about `seconds` long.
    No kernel can do its products faster on this path: what it spends besides them (unpacking
    blocks, scales, float sums) is what keeps it below.

    With `words`, the same for AVX2's vpmaddwd with the add that accumulates it, in G 16-bit
    multiply-adds per second: the instruction of the AVX2 int16 products of 4 or more act rows
    (`_ops.dot_peak_words`; a ValueError on the plain path)."""
    probe = _ops.dot_peak_words if words else _ops.dot_peak
    rounds = 1 << 12
    while True:  # grow the run until it takes a measurable time
        t = time.perf_counter()
        probe(rounds)
        dt = time.perf_counter() - t
        if dt >= seconds / 4 or rounds >= 1 << 40:
            break
        rounds *= 4
    rounds = max(8, int(rounds * seconds / max(dt, 1e-9)))
    best = 0.0
    for _ in range(repeats):
        t = time.perf_counter()
        done = probe(rounds)
        best = max(best, done / (time.perf_counter() - t) / 1e9)
    return best


def dot_instruction() -> str:
    """The multiply-add instruction measure_dot_peak times on the current path, in words."""
    return {"plain": "plain C byte products", "avx2": "AVX2 vpmaddubsw (with its adds)",
            "avx512": "256-bit vpdpbusd", "avx512w": "512-bit vpdpbusd",
            "amx": "512-bit vpdpbusd (the AMX tiles are not probed)",
            "amxbf16": "512-bit vpdpbusd (the AMX tiles are not probed)"}[_ops.simd_path()]


def int_products_per_token(model, logits_rows: float = 1.0) -> float:
    """Byte multiply-adds of the integer products per token: every integer-path matrix's weights
    times the act levels (2 for int16, 1 for int8; 0 in the float mode), the output head counted
    `logits_rows` times per token (1 for decode; 1 / P for a P-token prefill, which computes only
    its last row's logits). Float-path matrices (F32, F16, BF16 weights) are not counted."""
    levels = {"int16": 2, "int8": 1}.get(model.activations, 0)
    w = model.weights
    total = 0.0
    for lin, share in w.linears_per_token():
        if not lin.integer:
            continue
        n = lin.weight.shape[0] * lin.weight.shape[1] * share
        total += n * (logits_rows if lin is w.head else 1.0)
    return levels * total


def kernel_path() -> str:
    """The SIMD path the kernels take on this CPU, in words."""
    return {"plain": "plain C", "avx2": "AVX2+FMA+F16C",
            "avx512": "AVX2+FMA+F16C, AVX-512 VNNI integer products and AVX-512 attention",
            "avx512w": "AVX2+FMA+F16C, AVX-512 VNNI integer products (512-bit for several act rows) and "
                       "AVX-512 attention",
            "amx": "AVX2+FMA+F16C, AVX-512 VNNI integer products (512-bit for several act rows, AMX tiles "
                   "for 16 at a time) and AVX-512 attention",
            "amxbf16": "AVX2+FMA+F16C, AVX-512 VNNI integer products (512-bit for several act rows, AMX tiles "
                       "for 16 at a time, bf16 tiles for 16-bit rows where exact) and AVX-512 attention"}[_ops.simd_path()]


def roofline(model):
    """(measured GB/s, weight bytes read per decoded token, decode tok/s at that bandwidth)."""
    gbs = measure_bandwidth()
    per_token = weight_bytes_per_token(model)
    return gbs, per_token, gbs * 1e9 / per_token


def bench_model(model, prompt_tokens: int = 128, gen_tokens: int = 64, repeats: int = 3, seed: int = 0):
    """Median prefill and decode tokens/s over `repeats` runs on random prompt ids."""
    rng = np.random.default_rng(seed)
    n_vocab = model.n_vocab
    prefill, decode = [], []
    for _ in range(repeats):
        ids = rng.integers(0, n_vocab, prompt_tokens).tolist()
        seq = model.new_sequence(prompt_tokens + gen_tokens + 1)
        t0 = time.perf_counter()
        logits = model.forward(seq, ids)
        t1 = time.perf_counter()
        token = int(_ops.argmax(logits))
        for _ in range(gen_tokens):
            token = int(_ops.argmax(model.forward(seq, [token])))
        t2 = time.perf_counter()
        prefill.append(prompt_tokens / (t1 - t0))
        decode.append(gen_tokens / (t2 - t1))
    return {"prefill_tok_s": statistics.median(prefill), "decode_tok_s": statistics.median(decode),
            "prefill_runs": prefill, "decode_runs": decode}


# ---------------------------------------------------------------- `qwenc bench`: a llama-bench-like table

def _timed_prefill(model, ids) -> float:
    seq = model.new_sequence(len(ids) + 1)
    t0 = time.perf_counter()
    model.forward(seq, ids)
    return len(ids) / (time.perf_counter() - t0)


def _timed_decode(model, prompt, n) -> float:
    """tok/s of n greedy decode steps after `prompt` (prefilled untimed)."""
    seq = model.new_sequence(len(prompt) + n + 1)
    token = int(_ops.argmax(model.forward(seq, prompt)))
    t0 = time.perf_counter()
    for _ in range(n):
        token = int(_ops.argmax(model.forward(seq, [token])))
    return n / (time.perf_counter() - t0)


def batched_greedy(model, prompts, n):
    """(seconds, tokens): n greedy steps decoding len(prompts) sequences together over one shared
    cache, as a batching engine runs its streams (one forward step per token of each, the prompts
    prefilled together untimed); seconds counts the forward steps only, tokens[i] is sequence i's
    n tokens."""
    from .model import Sequence, StepItem
    tr = model.transformer
    seqs = Sequence.shared(model.config, [len(p) + n + 1 for p in prompts], tr.kv_dtype)
    logits = tr.forward_step([StepItem(s, list(p)) for s, p in zip(seqs, prompts)])
    tokens = [int(_ops.argmax(r)) for r in logits]
    out = [[] for _ in prompts]
    seconds = 0.0
    for _ in range(n):
        items = [StepItem(s, [t]) for s, t in zip(seqs, tokens)]
        t0 = time.perf_counter()
        logits = tr.forward_step(items)
        seconds += time.perf_counter() - t0
        tokens = [int(_ops.argmax(r)) for r in logits]
        for o, t in zip(out, tokens):
            o.append(t)
    return seconds, out


def _timed_batch(model, prompts, n) -> float:
    """tok/s of batched_greedy's steps."""
    return len(prompts) * n / batched_greedy(model, prompts, n)[0]


def current_rss_bytes() -> int:
    """Resident bytes now (Linux /proc; 0 where it is not available)."""
    try:
        with open("/proc/self/statm") as f:
            import os
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def peak_rss_bytes() -> int:
    import resource
    import sys
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


def bench_table(model, pp=512, tg=128, depth=4096, batches=(1, 4, 8, 16), batch_steps=16, repeats=3, seed=0):
    """Rows (test name, [tok/s per repeat]) for: prefill of pp tokens; tg decode steps after a
    short prompt and (depth > 0) after `depth` tokens of context; batched decode of B
    sequences, each row B * steps / seconds. Repeats are interleaved across tests."""
    rng = np.random.default_rng(seed)
    n_vocab = model.n_vocab
    tests = []
    if pp:
        tests.append((f"pp{pp}", lambda: _timed_prefill(model, rng.integers(0, n_vocab, pp).tolist())))
    if tg:
        tests.append((f"tg{tg}", lambda: _timed_decode(model, rng.integers(0, n_vocab, 16).tolist(), tg)))
        if depth:
            tests.append((f"tg{tg} @ d{depth}", lambda: _timed_decode(model, rng.integers(0, n_vocab, depth).tolist(), tg)))
    for b in batches or ():
        tests.append((f"tg{batch_steps} x B={b}", lambda b=b: _timed_batch(
            model, [rng.integers(0, n_vocab, 16).tolist() for _ in range(b)], batch_steps)))
    runs = {name: [] for name, _ in tests}
    for fn in (tests[0][1],) if tests else ():  # warm-up: faults the weights in
        fn()
    for r in range(repeats):
        for name, fn in (tests if r % 2 == 0 else tests[::-1]):
            runs[name].append(fn())
    return [(name, runs[name]) for name, _ in tests]


def format_table(rows) -> str:
    """Markdown table of dict rows (model, size, params, mode, threads, test, runs)."""
    out = ["| model | size | params | mode | threads | test | t/s |", "|---|---:|---:|---|---:|---|---:|"]
    for r in rows:
        runs = r["runs"]
        mean = statistics.fmean(runs)
        sd = statistics.stdev(runs) if len(runs) > 1 else 0.0
        out.append(f"| {r['model']} | {r['size'] / 2**20:.0f} MiB | {r['params'] / 1e6:.0f} M | {r['mode']} | "
                   f"{r['threads']} | {r['test']} | {mean:.2f} ± {sd:.2f} |")
    return "\n".join(out)


def parameter_count(model) -> int:
    w, cfg = model.weights, model.config
    n = sum(lin.weight.shape[0] * lin.weight.shape[1] for lin in w.linears())
    if w.lm_head is not w.embed:
        n += cfg.vocab_size * cfg.hidden_size
    return n


def weight_file_bytes(model) -> int:
    import os
    src = str(model.source)
    if os.path.isfile(src):
        return os.path.getsize(src)
    if os.path.isdir(src):
        return sum(os.path.getsize(os.path.join(src, f)) for f in os.listdir(src) if f.endswith(".safetensors"))
    return 0
