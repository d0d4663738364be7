"""qwenc vs transformers, same model, same run: prefill and decode tokens/s (medians).

    python bench/bench_decode.py [MODEL_DIR] [--threads N] [--repeats R]

Without MODEL_DIR, a random-weight model with the real Qwen2.5-0.5B shapes is saved in BF16 under
./bench-models (bench/make_qwen05b_shape.py). transformers runs the same checkpoint on the CPU in
bfloat16 (as stored) and in float32, with torch using the same thread count.
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's qwenc first


def bench_transformers(path, dtype, prompt_tokens, gen_tokens, repeats, threads):
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    rng = np.random.default_rng(0)
    prefill, decode = [], []
    for _ in range(repeats):
        ids = torch.tensor([rng.integers(0, 151000, prompt_tokens).tolist()])
        with torch.no_grad():
            t0 = time.perf_counter()
            out = model(ids, use_cache=True)
            t1 = time.perf_counter()
            past, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            for _ in range(gen_tokens):
                out = model(token, past_key_values=past, use_cache=True)
                past, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            t2 = time.perf_counter()
        prefill.append(prompt_tokens / (t1 - t0))
        decode.append(gen_tokens / (t2 - t1))
    return statistics.median(prefill), statistics.median(decode)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--no-transformers", action="store_true")
    args = ap.parse_args()

    import qwenc
    from qwenc.bench import bench_model, roofline
    if args.model is None:
        from make_qwen05b_shape import make
        args.model = str(make("bench-models/qwen05b-shape-bf16"))

    model = qwenc.load(args.model, threads=args.threads, context=args.prompt + args.gen + 8)
    gbs, per_token, roof = roofline(model)
    r = bench_model(model, args.prompt, args.gen, args.repeats)
    print(f"model {args.model}  threads {args.threads}  prompt {args.prompt}  gen {args.gen}  repeats {args.repeats}")
    print(f"read bandwidth {gbs:.1f} GB/s, weights read per token {per_token / 1e9:.3f} GB -> roofline {roof:.1f} tok/s")
    print(f"qwenc              prefill {r['prefill_tok_s']:8.1f} tok/s   decode {r['decode_tok_s']:6.2f} tok/s"
          f"  ({100 * r['decode_tok_s'] / roof:.0f}% of roofline)")
    del model
    if args.no_transformers:
        return
    for dtype in ("bfloat16", "float32"):
        p, d = bench_transformers(args.model, dtype, args.prompt, args.gen, args.repeats, args.threads)
        print(f"transformers {dtype:8s} prefill {p:8.1f} tok/s   decode {d:6.2f} tok/s"
              f"   qwenc/transformers: prefill {r['prefill_tok_s'] / p:.2f}x decode {r['decode_tok_s'] / d:.2f}x")


if __name__ == "__main__":
    main()
