"""Throughput of decode's matrix-vector product per weight type: float fused dots vs the integer
paths (16-bit and 8-bit activations, integer dots), on 1 and 2 threads.

A decode step is a matrix-vector product per weight matrix. This times `_quant.matvec` over a
4864 x 896 matrix (a 0.5B model's MLP projection; 896 x 4864 for the k-quants, whose rows must
be a multiple of 256), which runs as qw_matmul does for one activation row: each row dotted with
x by the fused float kernel (qw_dot_row), or x quantized once (qw_quantize_act, 16 or 8 bits,
included in the time) and each row dotted by the integer kernel; rows are
shared among OpenMP threads in chunks of 32. Rates are G multiply-adds per second, median over
interleaved repeats (float, int16, int8, float, ...) so machine noise hits all alike; "x" columns
are the integer paths' rates over the float one's. The default matrix fits in L3,
so this measures the kernels; --rows 151936 (the output head) measures them against memory.

    python bench/bench_quant_dot.py [--repeats N] [--types Q5_0,Q8_0,...] [--threads 1,2]
                                    [--rows R] [--plain]

--plain adds the plain C paths (QWENC_SIMD=0's kernels), single-threaded.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from qwenc import _quant
from qwenc.formats.tensors import BF16, BLOCK, DTYPE_NAMES, F16, F32

ROWS, COLS = 4864, 896


def random_weights(dtype, rows, cols, rng):
    """Stored bytes of a [rows, cols] matrix: random codes with small f16 scales (the kernels'
    speed does not depend on the values, only on their being finite)."""
    if dtype == F32:
        return rng.standard_normal((rows, cols), dtype=np.float32).view(np.uint8)
    if dtype == F16:
        return rng.standard_normal((rows, cols)).astype(np.float16).view(np.uint8)
    if dtype == BF16:
        return (rng.standard_normal((rows, cols), dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    elems, nbytes = BLOCK[dtype]
    blocks = rng.integers(0, 256, size=(rows, cols // elems, nbytes), dtype=np.uint8)
    # f16 scale fields: Q6_K keeps d at the end of its block, the others start with d (and a min)
    fields = [208] if DTYPE_NAMES[dtype] == "Q6_K" else [0, 2]
    for f in fields:
        scale = rng.uniform(-0.01, 0.01, size=blocks.shape[:2]).astype(np.float16)
        blocks[..., f:f + 2] = scale.view(np.uint8).reshape(blocks.shape[:2] + (2,))
    return blocks.reshape(rows, -1)


def rates(data, dtype, rows, cols, x, variants, repeats):
    """{variant: G MAC/s} for variants (activation bits or 0 for float, threads), timed
    interleaved; median of repeats. The integer variants run on the matrix repacked as the
    model repacks it at load (the row-interleaved layout)."""
    from qwenc import _ops
    mats = {0: (data, dtype)}
    if any(b for b, _ in variants):
        packed, r8 = _ops.repack(np.ascontiguousarray(data).reshape(-1), dtype, rows, cols)
        mats[8] = mats[16] = (packed, r8)
    times = {v: [] for v in variants}
    for v in variants:  # warm caches and thread pools
        _quant.matvec(*mats[v[0]], rows, cols, x, bits=v[0], threads=v[1])
    for _ in range(repeats):
        for v in variants:
            t0 = time.perf_counter()
            _quant.matvec(*mats[v[0]], rows, cols, x, bits=v[0], threads=v[1])
            times[v].append(time.perf_counter() - t0)
    return {v: rows * cols / statistics.median(t) / 1e9 for v, t in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--types", default="Q4_0,Q4_1,Q5_0,Q5_1,Q8_0,Q4_K,Q5_K,Q6_K,F32,F16,BF16")
    ap.add_argument("--threads", default="1,2", help="thread counts, comma-separated (default 1,2)")
    ap.add_argument("--rows", type=int, default=ROWS, help=f"matrix rows (default {ROWS})")
    ap.add_argument("--plain", action="store_true", help="also time the plain C kernels (1 thread)")
    args = ap.parse_args()
    by_name = {v: k for k, v in DTYPE_NAMES.items()}
    threads = [int(t) for t in args.threads.split(",")]
    rng = np.random.default_rng(0)
    print(f"matvec over {args.rows} x {COLS} (k-quants {COLS} x {args.rows}), G multiply-adds/s, "
          f"median of {args.repeats}; AVX2 available: {_quant.has_avx2()}")
    head = f"{'type':6} {'shape':>11}"
    for t in threads:
        head += f" {'float ' + str(t) + 'T':>9} {'int16 ' + str(t) + 'T':>9} {'x':>5} {'int8 ' + str(t) + 'T':>8} {'x':>5}"
    if args.plain:
        head += f" {'plain f':>8} {'plain i16':>9} {'plain i8':>8}"
    print(head)
    prev = _quant.set_simd(True)
    try:
        for name in args.types.split(","):
            dtype = by_name[name]
            elems = BLOCK[dtype][0]
            rows, cols = (args.rows, COLS) if COLS % elems == 0 else (COLS, args.rows - args.rows % 256)
            data = random_weights(dtype, rows, cols, rng)
            x = rng.standard_normal(cols, dtype=np.float32)
            has_int = _quant.act_bytes(dtype, cols) > 0
            modes = (0, 16, 8) if has_int else (0,)
            variants = [(b, t) for t in threads for b in modes]
            r = rates(data, dtype, rows, cols, x, variants, args.repeats)
            line = f"{name:6} {rows:>5}x{cols:<5}"
            for t in threads:
                f = r[(0, t)]
                if has_int:
                    i16, i8 = r[(16, t)], r[(8, t)]
                    line += f" {f:9.2f} {i16:9.2f} {i16 / f:5.2f} {i8:8.2f} {i8 / f:5.2f}"
                else:
                    line += f" {f:9.2f} {'-':>9} {'':>5} {'-':>8} {'':>5}"
            if args.plain:
                _quant.set_simd(False)
                p = rates(data, dtype, rows, cols, x, [(b, 1) for b in modes], max(3, args.repeats // 5))
                _quant.set_simd(True)
                nan = float("nan")
                line += f" {p[(0, 1)]:8.2f} {p.get((16, 1), nan):9.2f} {p.get((8, 1), nan):8.2f}"
            print(line, flush=True)
    finally:
        _quant.set_simd(prev)


if __name__ == "__main__":
    main()
