"""What a cheaper rounding of the activations would cost in fidelity, before writing a kernel for it.

    python bench/emulate_act_rounding.py [GGUF] [--int8-on q_proj,k_proj;gate_proj,up_proj;...]
                                         [--drop-k 64,1024,16384]

transformers loads the GGUF in float32 (as bench/real_model_quality.py does), and a forward
pre-hook on every linear layer replaces its input by the values of qwenc's own act rows
(`_quant.quantize_activations`: per 32 values, level 1's codes with d = max|x| / 127, level 2's
with d / 256). Each variant's logits over the quality texts (the suite's 2,152 positions, qwenc's
tokenizer) are compared with the unrounded model's by real_model_quality's comparison: top-1
agreement and mean KL over the real vocabulary, as in the quality table. The products stay
float32 here, so the figures are the rounding's alone (with a float32 KV cache); int16 and int8
are printed first to check the emulation against the table.

Variants:
  --int8-on  groups separated by ';', each a comma list of module-name parts: those layers' inputs
             get 8-bit rows, all others 16-bit.
  --drop-k   16-bit rows, but a block's level 2 is dropped where its max|x| squared is at most
             k / 65536 of the mean over the row's blocks (so each dropped block's error stays
             within about sqrt(k) times int16's); prints the share of blocks dropped.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # real_model_quality
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from real_model_quality import SUITE, Tally, compare_logits, load_reference, reference_logits, text_windows  # noqa: E402


def act_levels(x, bits):
    """float64 [rows, n / 32, 32] twice: the values of each row's level 1 and (16 bits; else
    zeros) level 2, from qwenc's act rows of the float32 rows x."""
    from qwenc import _quant
    from qwenc.formats.tensors import Q8_0
    rows, n = x.shape
    xq = _quant.quantize_activations(x, Q8_0, bits=bits)
    half = _quant.act_bytes(Q8_0, n)

    def values(level):
        codes = level[:, :n].view(np.int8).astype(np.float64).reshape(rows, n // 32, 32)
        d = np.ascontiguousarray(level[:, n:n + 4 * (n // 32)]).view(np.float32).astype(np.float64)
        return codes * d[:, :, None]

    one = values(xq[:, :half])
    return one, values(xq[:, half:]) if bits == 16 else np.zeros_like(one)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", nargs="?", help="GGUF file (default: the demo model)")
    ap.add_argument("--int8-on", default="q_proj,k_proj;gate_proj,up_proj;down_proj;o_proj,v_proj;lm_head")
    ap.add_argument("--drop-k", default="64,1024,16384")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch
    import qwenc
    from qwenc.formats.demo import demo_model_path
    torch.set_num_threads(args.threads)
    path = str(args.gguf or demo_model_path())
    ours = qwenc.load(path)  # for its tokenizer and real vocabulary, as real_model_quality
    windows, n_vocab = text_windows(ours.tokenizer, names=SUITE), ours.n_vocab
    del ours
    ref = load_reference(path)
    state = {"rule": None, "dropped": 0, "blocks": 0}

    def rounded(x, rule):
        kind, k = rule
        flat = x.detach().reshape(-1, x.shape[-1]).float().numpy()
        one, two = act_levels(flat, 8 if kind == "int8" else 16)
        if kind == "drop":
            amax2 = np.abs(flat).reshape(one.shape).max(axis=2).astype(np.float64) ** 2
            drop = amax2 * 65536.0 <= k * amax2.mean(axis=1, keepdims=True)
            two = np.where(drop[:, :, None], 0.0, two)
            state["dropped"] += int(drop.sum())
            state["blocks"] += drop.size
        return torch.from_numpy((one + two).astype(np.float32).reshape(x.shape)).to(x.dtype)

    def hook_for(name):
        def hook(_module, inputs):
            rule = state["rule"]
            if rule is None:
                return None
            if rule[0] == "mix":
                rule = ("int8", 0) if any(part in name for part in rule[1]) else ("int16", 0)
            return (rounded(inputs[0], rule),)
        return hook

    for name, module in ref.named_modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_pre_hook(hook_for(name))

    base = [reference_logits(ref, ids) for _, ids in windows]
    variants = [("int16 everywhere", ("int16", 0)), ("int8 everywhere", ("int8", 0))]
    variants += [(f"int8 on {g}", ("mix", tuple(p for p in g.split(",") if p)))
                 for g in args.int8_on.split(";") if g]
    variants += [(f"level 2 dropped, k = {k}", ("drop", float(k))) for k in args.drop_k.split(",") if k]
    print(f"model {Path(path).name}: {len(windows)} texts")
    print("| variant | top-1 | mean KL (nats) | blocks dropped |\n|---|---:|---:|---:|")
    for label, rule in variants:
        state.update(rule=rule, dropped=0, blocks=0)
        t = Tally()
        for want, (_, ids) in zip(base, windows):
            t.add(*compare_logits(want, reference_logits(ref, ids), n_vocab))
        share = f"{100.0 * state['dropped'] / state['blocks']:.1f}%" if state["blocks"] else ""
        print(f"| {label} | {100 * t.agreement:.2f}% | {t.mean_kl:.2e} | {share} |", flush=True)
    print(f"({t.positions} positions)")


if __name__ == "__main__":
    main()
