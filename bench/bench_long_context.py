"""Decode after a long context against decode after 128 tokens, in one process, interleaved.

Two sequences are prefilled (128 and DEPTH random token ids), then greedy decode alternates
between them in bursts (the order reversed every other round), so both figures see the same
machine state; the ratio of the medians is what the long-context goal is stated in.

    python bench/bench_long_context.py [--model GGUF] [--depth 4096] [--rounds 12]
"""
import argparse
import time

import numpy as np

import qwenc


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo", help="GGUF file, model directory, demo or demo-1.5b (default demo)")
    ap.add_argument("--depth", type=int, default=4096, help="tokens of context of the long sequence (default 4096)")
    ap.add_argument("--rounds", type=int, default=12, help="bursts per sequence (default 12)")
    ap.add_argument("--burst", type=int, default=16, help="decode steps per burst (default 16)")
    ap.add_argument("--activations", default="int16", help="activation mode (default int16)")
    ap.add_argument("--threads", type=int, default=None, help="kernel threads (default: all CPUs)")
    a = ap.parse_args()
    steps = a.rounds * a.burst
    llm = qwenc.load(a.model, activations=a.activations, threads=a.threads, context=a.depth + steps + 16)
    rng = np.random.default_rng(0)
    seqs = {}
    for d in (128, a.depth):
        s = llm.new_sequence()
        t0 = time.perf_counter()
        llm.forward(s, [int(t) for t in rng.integers(100, 20000, d)])
        print(f"prefill {d:5d} tokens: {d / (time.perf_counter() - t0):.1f} tok/s", flush=True)
        seqs[d] = s
    rates = {d: [] for d in seqs}
    for r in range(a.rounds):
        for d in ((128, a.depth) if r % 2 == 0 else (a.depth, 128)):
            s, tok = seqs[d], 100
            t0 = time.perf_counter()
            for _ in range(a.burst):
                tok = int(np.argmax(llm.forward(s, [tok])))
            rates[d].append(a.burst / (time.perf_counter() - t0))
    short, long = float(np.median(rates[128])), float(np.median(rates[a.depth]))
    print(f"{llm.name}, {a.activations}, {llm.threads} threads: decode @128 {short:.2f} tok/s, "
          f"@{a.depth} {long:.2f} tok/s, ratio {long / short:.3f} (medians of {a.rounds} bursts of {a.burst})")


if __name__ == "__main__":
    main()
