"""Batched decode: one forward step over B sequences against B steps of one.

    python bench/bench_batched_decode.py [--model GGUF] [--activations f32,int16,int8]
                                         [--batch 1,4,8,16] [--threads 2] [--steps 16] [--repeats 3]

For each activation mode, B sequences (blocks of one shared KV cache, as the engine's, each with
its own seeded random prompt of --prompt tokens, prefilled untimed) are decoded together: each step is one
Transformer.forward_step with B single-token StepItems, exactly what a batching engine does for
B running streams. Rate = B * steps / seconds (the argmax of each row's logits feeding its next
token, untimed work excluded). Batch sizes are interleaved within each repeat (order reversed on
odd repeats) so drift in the machine's load hits them alike; the table gives medians over the
repeats, and each B's rate over B = 1's (the target: 8 rows at least 4x, 16 at least 6x).

Every run also checks batch invariance on the model: the tokens each sequence got in the batch
equal the tokens it gets when decoded alone (same kernels whatever the batch), and says so.
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="GGUF file (default: the demo model)")
    ap.add_argument("--activations", default="f32,int16,int8")
    ap.add_argument("--batch", default="1,4,8,16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens per sequence (default 32)")
    ap.add_argument("--steps", type=int, default=16, help="timed decode steps per run (default 16)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--time-limit", type=float, default=900, help="stop repeating after this many seconds")
    args = ap.parse_args()
    import qwenc
    from qwenc.bench import batched_greedy
    from qwenc.formats.demo import demo_model_path
    path = args.model or str(demo_model_path())
    batches = [int(b) for b in args.batch.split(",")]
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 150000, args.prompt).tolist() for _ in range(max(batches))]
    print(f"model {os.path.basename(path)}   threads {args.threads}   prompt {args.prompt}   steps {args.steps}   "
          f"repeats {args.repeats}   load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    start = time.perf_counter()
    results = {}
    for mode in args.activations.split(","):
        model = qwenc.load(path, threads=args.threads, activations=mode, context=args.prompt + args.steps + 1)
        batched_greedy(model, prompts[:1], 2)  # warm-up: faults in the weights
        rates = {b: [] for b in batches}
        big, batched = max(batches), None
        for rep in range(args.repeats):
            for b in (batches if rep % 2 == 0 else batches[::-1]):
                seconds, toks = batched_greedy(model, prompts[:b], args.steps)
                rates[b].append(b * args.steps / seconds)
                if b == big and batched is None:
                    batched = toks
            if time.perf_counter() - start > args.time_limit:
                break
        # invariance: each sequence of the largest batch, decoded alone, gets the same tokens
        same = all(batched_greedy(model, [prompts[i]], args.steps)[1][0] == batched[i] for i in range(big))
        base = statistics.median(rates[1]) if 1 in rates else None
        results[mode] = (rates, base, same)
        del model
    print()
    print("| mode | " + " | ".join(f"B={b} tok/s" for b in batches) + " | rows identical to alone |")
    print("|---|" + "---|" * len(batches) + "---|")
    for mode, (rates, base, same) in results.items():
        cells = []
        for b in batches:
            med = statistics.median(rates[b])
            ratio = f" ({med / base:.1f}x)" if base and b != 1 else ""
            cells.append(f"{med:.1f}{ratio}")
        print(f"| {mode} | " + " | ".join(cells) + f" | {'yes' if same else 'NO'} |")
    print(f"\n{len(next(iter(results.values()))[0][batches[0]])} repeats; "
          f"load average after {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
