"""Throughput of the fused row-dot kernels (qw_dot_row) per weight type, AVX2 vs plain C.

A decode step is a matrix-vector product per weight matrix, i.e. one qw_dot_row per output
row; this times `dot_rows` over a 4864 x 896 matrix (the size of a 0.5B model's MLP projection)
and prints the median rate in G elements (multiply-adds) per second, single-threaded. The matrix
fits in L3, so this measures the kernels, not memory bandwidth.

    python bench/bench_quant_dot.py [--repeats N] [--types Q5_0,Q8_0,...]
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from qwenc import _quant
from qwenc.tensors import BF16, BLOCK, DTYPE_NAMES, F16, F32

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


def time_dot(data, dtype, rows, cols, x, repeats):
    _quant.dot_rows(data, dtype, rows, cols, x)  # warm caches
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _quant.dot_rows(data, dtype, rows, cols, x)
        times.append(time.perf_counter() - t0)
    return rows * cols / statistics.median(times) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--types", default="Q4_0,Q4_1,Q5_0,Q5_1,Q8_0,Q4_K,Q5_K,Q6_K,F32,F16,BF16")
    args = ap.parse_args()
    by_name = {v: k for k, v in DTYPE_NAMES.items()}
    rng = np.random.default_rng(0)
    print(f"dot_rows over {ROWS * COLS / 1e6:.2f}M elements, median of {args.repeats}, 1 thread "
          f"(AVX2 available: {_quant.has_avx2()})")
    print(f"{'type':6} {'shape':>10} {'AVX2 G/s':>9} {'plain G/s':>9} {'speedup':>8}")
    for name in args.types.split(","):
        dtype = by_name[name]
        elems = BLOCK[dtype][0]
        # k-quant rows must be a multiple of 256: use the transposed shape (a down projection)
        rows, cols = (ROWS, COLS) if COLS % elems == 0 else (COLS, ROWS)
        data = random_weights(dtype, rows, cols, rng)
        x = rng.standard_normal(cols, dtype=np.float32)
        prev = _quant.set_simd(True)
        fast = time_dot(data, dtype, rows, cols, x, args.repeats) if _quant.has_avx2() else float("nan")
        _quant.set_simd(False)
        plain = time_dot(data, dtype, rows, cols, x, max(3, args.repeats // 5))
        _quant.set_simd(prev)
        print(f"{name:6} {rows:>5}x{cols:<4} {fast:9.2f} {plain:9.2f} {fast / plain:7.1f}x")


if __name__ == "__main__":
    main()
