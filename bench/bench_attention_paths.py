"""Decode attention alone on each SIMD path this CPU has, in one process, paths alternating.

One query row attends to CONTEXT positions of a float16 paged cache with a pool per layer (as a
model keeps them, so the layers' keys and values come from memory, not cache), for LAYERS layers;
the time per token is the median over rounds, each round running every path once. Also checks
that all SIMD paths give the same bits.

    PYTHONPATH=. python bench/bench_attention_paths.py [--heads 14 --kv-heads 2 --head-dim 64]
                                                       [--context 4096] [--layers 24] [--rounds 15]

The defaults are Qwen2.5-0.5B's shapes (7 query heads per kv head); 12/2/128 and 28 layers are
the 1.5B's.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from qwenc import _ops


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", type=int, default=14)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    H, Hkv, hd, n = args.heads, args.kv_heads, args.head_dim, args.context
    bs = 16
    blocks = n // bs + 1
    rng = np.random.default_rng(1)
    pools = [(rng.standard_normal((Hkv, blocks, hd, bs)).astype(np.float16),
              rng.standard_normal((Hkv, blocks, bs, hd)).astype(np.float16)) for _ in range(args.layers)]
    q = rng.standard_normal((1, H, hd)).astype(np.float32)
    o = np.empty_like(q)
    table = np.arange(blocks, dtype=np.int32)[None]
    row_seq, row_pos = np.zeros(1, np.int32), np.array([n], np.int64)
    paths = [p for p in _ops.simd_paths() if p != "plain"] or ["plain"]
    times, outs = {p: [] for p in paths}, {}
    prev = _ops.simd_path()
    try:
        for _ in range(args.rounds):
            for p in paths:
                _ops.set_simd_path(p)
                t = time.perf_counter()
                for Kc, Vc in pools:
                    _ops.paged_attention(q, Kc, Vc, table, row_seq, row_pos, hd ** -0.5, o)
                times[p].append(time.perf_counter() - t)
                outs[p] = o.copy()
    finally:
        _ops.set_simd_path(prev)
    same = all((outs[p].view(np.uint32) == outs[paths[0]].view(np.uint32)).all() for p in paths)
    print(f"heads {H}/{Hkv}, head_dim {hd}, context {n}, {args.layers} layers, {_ops.get_threads()} threads, "
          f"medians of {args.rounds}")
    for p in paths:
        print(f"  {p:7s} {1e3 * statistics.median(times[p]):7.2f} ms per token")
    print("  all paths give the same bits" if same else "  PATHS DIFFER")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
