"""What a grammar constraint costs per decoded token, against the decode step it rides on.

On the demo model (Qwen2.5-Coder-0.5B-Instruct Q4_K_M, Qwen's 151,936-row vocabulary):
- batch 1: for each token of a JSON document, the mask (llguidance fill_mask) plus applying it
  to the logits row (apply_mask), timed interleaved with one decode step of the model, so the
  ratio is taken under the same machine load;
- batches of 8 and 16 constrained rows: one fill_masks call for all rows on llguidance's thread
  pool against the same call filling them in turn in the calling thread (GIL released in both).

Usage: python bench/bench_constraints.py [--repeats 5] [--threads N]
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import qwenc  # noqa: E402
from qwenc.engine import constraints as C  # noqa: E402
from qwenc.formats.demo import demo_model_path  # noqa: E402

SCHEMA = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"$ref": "#/$defs/address"},
        "born": {"type": "string", "format": "date"}},
    "required": ["name", "age", "address"],
    "$defs": {"address": {"type": "object", "properties": {
        "street": {"type": "string"}, "city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
        "required": ["city"]}},
}
DOC = json.dumps({"name": "Ada Lovelace, Countess of Lovelace", "age": 36, "email": "ada@example.org",
                  "tags": ["mathematics", "poetical science", "analytical engine"],
                  "address": {"street": "12 St James's Square", "city": "London", "zip": "12345"},
                  "born": "1815-12-10"})


def median_ms(xs):
    return 1e3 * statistics.median(xs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="model threads")
    args = ap.parse_args()
    model = qwenc.load(demo_model_path(), threads=args.threads)
    tok = model.tokenizer
    t0 = time.perf_counter()
    info = C.tokenizer_info(model)
    t1 = time.perf_counter()
    grammar = C.compile_constraint(info, SCHEMA)
    t2 = time.perf_counter()
    print(f"vocabulary rows {info.n_rows}, mask words {info.n_words}; TokenizerInfo {1e3 * (t1 - t0):.0f} ms, "
          f"schema compile {1e3 * (t2 - t1):.2f} ms")
    ids = tok.encode(DOC)
    seq = model.new_sequence()
    logits = model.forward(seq, tok.encode("Write JSON about Ada Lovelace:"))
    mask_t, decode_t, string_t = [], [], []
    row = np.zeros(info.n_words, dtype=np.int32)
    in_string = []
    text = ""
    for t in ids:  # where the document is inside a string, nearly every token is allowed
        in_string.append(text.count('"') % 2 == 1)
        text += tok.decode([t])
    for rep in range(args.repeats):
        m = grammar.matcher()
        seq.truncate(0)
        model.forward(seq, tok.encode("x"))
        for i, t in enumerate(ids):
            lg = logits.copy()
            s = time.perf_counter()
            m.fill_mask(row)
            C.apply_mask(lg, row)
            e = time.perf_counter()
            assert np.isfinite(lg[t])
            mask_t.append(e - s)
            if in_string[i]:
                string_t.append(e - s)
            m.accept(t)
            if i % 4 == 0 and len(seq) < 200:  # a decode step, interleaved
                s = time.perf_counter()
                model.forward(seq, [t])
                decode_t.append(time.perf_counter() - s)
    step = median_ms(decode_t)
    mean_mask = 1e3 * statistics.mean(mask_t)
    print(f"batch 1: decode step median {step:.2f} ms ({len(decode_t)} steps); mask+apply per token: median "
          f"{median_ms(mask_t):.3f} ms, mean {mean_mask:.3f} ms, p90 {1e3 * np.percentile(mask_t, 90):.3f} ms, "
          f"max {1e3 * max(mask_t):.3f} ms over {len(mask_t)} tokens; inside strings median {median_ms(string_t):.3f} ms")
    print(f"         mean mask cost = {100 * mean_mask / step:.2f} % of a decode step")

    # batches: rows at different points of the document, each advancing one token per step (a
    # mask asked twice in one state is answered from a cache, which would flatter the timing).
    # Two identical sets, one filled by one fill_masks call, the other row by row, interleaved.
    for batch in (8, 16):
        sets = []
        for _ in range(2):
            ms = []
            for k in range(batch):
                m = grammar.matcher()
                for t in ids[: (k * len(ids)) // (2 * batch)]:
                    m.accept(t)
                ms.append(m)
            sets.append(ms)
        starts = [(k * len(ids)) // (2 * batch) for k in range(batch)]
        bitmask = C.new_bitmask(batch, info)
        par, seqt = [], []
        steps = len(ids) // 2
        pool = str(max(2, os.cpu_count() or 2))
        for step_i in range(steps):
            os.environ["QWENC_MASK_THREADS"] = pool
            s = time.perf_counter()
            C.fill_masks(sets[0], bitmask)
            par.append(time.perf_counter() - s)
            os.environ["QWENC_MASK_THREADS"] = "1"
            s = time.perf_counter()
            C.fill_masks(sets[1], bitmask)
            seqt.append(time.perf_counter() - s)
            for ms in sets:
                for k, m in enumerate(ms):
                    m.accept(ids[starts[k] + step_i])
        lg = np.zeros((batch, info.n_rows), dtype=np.float32)
        app = []
        for _ in range(10 * args.repeats):
            s = time.perf_counter()
            C.apply_mask(lg, bitmask)
            app.append(time.perf_counter() - s)
        print(f"batch {batch}: fill_masks on a {pool}-thread pool: median {median_ms(par):.3f} ms, mean "
              f"{1e3 * statistics.mean(par):.3f} ms; in the calling thread: median {median_ms(seqt):.3f} ms, mean "
              f"{1e3 * statistics.mean(seqt):.3f} ms over "
              f"{steps} steps; apply_mask {median_ms(app):.3f} ms")
    print(f"cpus {os.cpu_count()}, model threads {model.threads}")


if __name__ == "__main__":
    main()
