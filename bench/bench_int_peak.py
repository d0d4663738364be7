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

On the 512-bit pair kernels (path avx512w) each round also times `_ops.dot_peak_mix`: the same
instruction with the float multiplies and FMAs that the kernel spends per block and pair of act
rows mixed in (per 16 vpdpbusd: 2 for Q4_0, Q5_0 and Q8_0, 3 for the types with a min, 4 for
Q6_K; twice that for int8, whose blocks take 8 vpdpbusd). Where float and integer multiply-adds
share execution ports that mix is the kernel's ceiling, and the last two columns give it (as a
share of the plain probe) and the product's rate as a share of it.

On the AVX2 path, where int16 products of 6-8 or 11 or more rows (`_ops.takes_vertical`)
multiply joined rows with `vpmaddwd`, each round also times `_ops.dot_peak_words`: that
instruction with the add that accumulates it, in register chains with no loads. The last column
gives each int16 product's 16-bit multiply-adds (half its byte figure) as a share of that rate:
how far the joined kernel is from its own instruction's ceiling (the byte probe above is the
two-level kernels' instruction mix).
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


def probe(rounds, fp=None):
    t = time.perf_counter()
    done = _ops.dot_peak(rounds) if fp is None else _ops.dot_peak_mix(rounds, fp)
    return done / (time.perf_counter() - t) / 1e9


def probe_words(rounds):
    t = time.perf_counter()
    done = _ops.dot_peak_words(rounds)
    return done / (time.perf_counter() - t) / 1e9


def float_work(dtype_name, act):
    """512-bit float multiplies and FMAs per 16 vpdpbusd in the pair kernels (intdot_avx512.c):
    per block and pair, one multiply of the two scales and one FMA, one more FMA for a min, and
    Q6_K's two 16-value groups each their own; int16 spends 16 vpdpbusd per block, int8 8."""
    per_block = 4 if dtype_name == "Q6_K" else 3 if dtype_name in ("Q4_1", "Q5_1", "Q4_K", "Q5_K") else 2
    return per_block * (1 if act == 16 else 2)


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
    mats, kinds = [], {}  # kinds: each label's block type
    for name in args.tensors.split(","):
        t = g.tensors[name]
        K, N = t.shape
        R, r8 = _ops.repack(np.ascontiguousarray(g.tensor_bytes(name)), t.dtype, N, K)
        X = np.random.default_rng(0).standard_normal((args.rows, K)).astype(np.float32)
        label = f"{name} ({DTYPE_NAMES.get(t.dtype)}, {N} x {K})"
        kinds[label] = DTYPE_NAMES.get(t.dtype)
        mats.append((label, R, r8, N, K, X))
    mixed = _ops.simd_path() == "avx512w" and args.rows >= 2
    fps = sorted({float_work(kind, act) for kind in kinds.values() for act in (16, 8)}) if mixed else []
    words = _ops.takes_vertical(args.rows)
    peaks, rates, shares, ceilings, word_peaks, word_shares = [], {}, {}, {}, [], {}
    for _ in range(args.rounds):
        p = probe(args.probe_rounds)
        peaks.append(p)
        pw = probe_words(args.probe_rounds) if words else None
        if words:
            word_peaks.append(pw)
        for fp in fps:
            ceilings.setdefault(fp, []).append(probe(args.probe_rounds, fp) / p)
        for label, R, r8, N, K, X in mats:
            for act in (16, 8):
                Y = np.empty((args.rows, N), np.float32)
                t = time.perf_counter()
                _ops.matmul(R, r8, N, K, X, Y, None, act)
                r = (2 if act == 16 else 1) * args.rows * N * K / (time.perf_counter() - t) / 1e9
                rates.setdefault((label, act), []).append(r)
                shares.setdefault((label, act), []).append(r / p)
                if words and act == 16:
                    word_shares.setdefault(label, []).append(r / 2 / pw)
    best = max(peaks)
    print(f"path {_ops.simd_path()}, {args.threads} thread(s), {args.rows} act rows, {args.rounds} rounds; "
          f"probe median {statistics.median(peaks):.0f}, best {best:.0f} G/s")
    if words:
        print(f"16-bit probe (vpmaddwd + add, registers only): median {statistics.median(word_peaks):.0f}, "
              f"best {max(word_peaks):.0f} G 16-bit MAC/s")
    head = "| tensor | act | G MAC/s (median) | of the best probe | of its round's probe (median) |"
    if mixed:
        head += " float-work ceiling (of the probe) | of that ceiling |"
    if words:
        head += " int16: of its round's 16-bit probe (median) |"
    print(head)
    print("|---|---|---:|---:|---:|" + ("---:|---:|" if mixed else "") + ("---:|" if words else ""))
    for (label, act), v in rates.items():
        m = statistics.median(v)
        share = statistics.median(shares[(label, act)])
        row = f"| {label} | int{act} | {m:.0f} | {100 * m / best:.0f}% | {100 * share:.0f}% |"
        if mixed:
            ceiling = statistics.median(ceilings[float_work(kinds[label], act)])
            row += f" {100 * ceiling:.0f}% | {100 * share / ceiling:.0f}% |"
        if words:
            row += f" {100 * statistics.median(word_shares[label]):.0f}% |" if act == 16 else " |"
        print(row)


if __name__ == "__main__":
    main()
