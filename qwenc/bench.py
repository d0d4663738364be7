"""Prefill and decode throughput of a loaded model, and how decode compares to its roofline.

Decode reads every weight matrix once per token (the embedding only one row), so its speed limit
is memory bandwidth / bytes read per token. `weight_bytes_per_token` counts those bytes and
`measure_bandwidth` measures the machine's read bandwidth with the same threads, so the report
can say what share of the roofline a run reaches.
"""
import statistics
import time

import numpy as np

from .formats.tensors import row_bytes


def weight_bytes_per_token(model) -> int:
    w, cfg = model.weights, model.config
    total = 0
    for layer in w.layers:
        for lin in (layer.q, layer.k, layer.v, layer.o, layer.gate, layer.up, layer.down):
            total += lin.weight.data.nbytes
    total += w.lm_head.data.nbytes
    if w.lm_head is not w.embed:
        total += row_bytes(w.embed.dtype, cfg.hidden_size)
    return total


def measure_bandwidth(mb: int = 1024, repeats: int = 5) -> float:
    """Read bandwidth in GB/s: the best of `repeats` BF16 matrix-vector products over `mb` MB
    (all threads), after one warm-up pass. Far larger than the caches, so it is DRAM speed."""
    from . import _ops
    K = 4096
    N = mb * (1 << 20) // (2 * K)
    W = np.ones((N, K), np.uint16)
    x = np.ones((1, K), np.float32)
    y = np.empty((1, N), np.float32)
    times = []
    _ops.matmul(W.reshape(-1).view(np.uint8), 30, N, K, x, y)
    for _ in range(repeats):
        t = time.perf_counter()
        _ops.matmul(W.reshape(-1).view(np.uint8), 30, N, K, x, y)
        times.append(time.perf_counter() - t)
    return W.nbytes / min(times) / 1e9


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
        token = int(np.argmax(logits))
        for _ in range(gen_tokens):
            token = int(np.argmax(model.forward(seq, [token])))
        t2 = time.perf_counter()
        prefill.append(prompt_tokens / (t1 - t0))
        decode.append(gen_tokens / (t2 - t1))
    return {"prefill_tok_s": statistics.median(prefill), "decode_tok_s": statistics.median(decode),
            "prefill_runs": prefill, "decode_runs": decode}
