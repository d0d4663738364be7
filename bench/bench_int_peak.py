"""The integer products of a model's matrices as a share of the integer peak, in one process.

    python bench/bench_int_peak.py [--model demo-1.5b] [--tensors blk.0.ffn_up.weight,...]
                                   [--rows 512] [--threads 1] [--rounds 9]

Each round times the peak probe (`_ops.dot_peak`: the current path's multiply-add instruction in
independent chains on the kernels' threads, as `qwenc bench` does) and then, for each tensor, one
`_ops.matmul` of --rows act rows on its repacked layout in int16 and int8, so machine noise hits
probe and products alike. A product's rate is in G byte multiply-adds per second (rows x weights
x act levels); the table gives its median, as a share of the best probe of the run and as the
median of its shares of the probe of its own round. A product at 100% of the best probe does
nothing but its multiply-adds' instructions at their rate: what is left of the gap is the kernel's
other work (unpacking blocks, offsets, float sums).
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from qwenc import _ops
from qwenc.formats.gguf import GGUFFile
from qwenc.formats.resolve import resolve_model_path
from qwenc.formats.tensors import DTYPE_NAMES


def probe(rounds):
    t = time.perf_counter()
    done = _ops.dot_peak(rounds)
    return done / (time.perf_counter() - t) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo-1.5b", help="GGUF path or a name qwenc resolves")
    ap.add_argument("--tensors", default="blk.0.ffn_up.weight,blk.0.ffn_down.weight")
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--probe-rounds", type=int, default=4_000_000, help="dot_peak rounds per probe")
    args = ap.parse_args()
    _ops.set_threads(args.threads)
    g = GGUFFile(resolve_model_path(args.model))
    mats = []
    for name in args.tensors.split(","):
        t = g.tensors[name]
        K, N = t.shape
        R, r8 = _ops.repack(np.ascontiguousarray(g.tensor_bytes(name)), t.dtype, N, K)
        X = np.random.default_rng(0).standard_normal((args.rows, K)).astype(np.float32)
        mats.append((f"{name} ({DTYPE_NAMES.get(t.dtype)}, {N} x {K})", R, r8, N, K, X))
    peaks, rates, shares = [], {}, {}
    for _ in range(args.rounds):
        p = probe(args.probe_rounds)
        peaks.append(p)
        for label, R, r8, N, K, X in mats:
            for act in (16, 8):
                Y = np.empty((args.rows, N), np.float32)
                t = time.perf_counter()
                _ops.matmul(R, r8, N, K, X, Y, None, act)
                r = (2 if act == 16 else 1) * args.rows * N * K / (time.perf_counter() - t) / 1e9
                rates.setdefault((label, act), []).append(r)
                shares.setdefault((label, act), []).append(r / p)
    best = max(peaks)
    print(f"path {_ops.simd_path()}, {args.threads} thread(s), {args.rows} act rows, {args.rounds} rounds; "
          f"probe median {statistics.median(peaks):.0f}, best {best:.0f} G/s")
    print("| tensor | act | G MAC/s (median) | of the best probe | of its round's probe (median) |")
    print("|---|---|---:|---:|---:|")
    for (label, act), v in rates.items():
        m = statistics.median(v)
        print(f"| {label} | int{act} | {m:.0f} | {100 * m / best:.0f}% | "
              f"{100 * statistics.median(shares[(label, act)]):.0f}% |")


if __name__ == "__main__":
    main()
