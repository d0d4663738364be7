"""What a cheaper rounding of the activations would cost in fidelity, before writing a kernel for it.

    python bench/emulate_act_rounding.py [GGUF] [--int8-on q_proj,k_proj;gate_proj,up_proj;...]
                                         [--drop-k 64,1024,16384]

transformers loads the GGUF in float32 (as bench/real_model_quality.py does), and a forward
pre-hook on every linear layer rounds its input the way qwenc's act quantizer does (act.c: per
32 values, d = max|x| / 127, level 1 = round(x / d), level 2 = round(256 (x / d - level 1)) clamped
to +-127). Each variant's logits over the quality texts (the suite's 2,152 positions with the
Qwen2.5 tokenizer) are compared with the unrounded model's: top-1 agreement and mean KL, as in
the quality table. The products stay float32 here, so the figures are the rounding's alone (with
a float32 KV cache); int16 and int8 are printed first to check the emulation against the table.

Variants:
  --int8-on  groups separated by ';', each a comma list of module-name parts: those layers' inputs
             get 8-bit codes (level 1 only), all others 16-bit.
  --drop-k   16-bit codes, but a block's level 2 is dropped where its max|x| squared is at most
             k / 65536 of the mean over the row's blocks (so each dropped block's error stays
             within about sqrt(k) times int16's); prints the share of blocks dropped.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # real_model_quality
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from real_model_quality import load_reference, text_windows  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", nargs="?", help="GGUF file (default: the demo model)")
    ap.add_argument("--int8-on", default="q_proj,k_proj;gate_proj,up_proj;down_proj;o_proj,v_proj;lm_head")
    ap.add_argument("--drop-k", default="64,1024,16384")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch
    from transformers import AutoTokenizer
    from qwenc.formats.demo import demo_model_path
    torch.set_num_threads(args.threads)
    path = Path(args.gguf or demo_model_path())
    ref = load_reference(path)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    windows = text_windows(tok)
    state = {"rule": None, "dropped": 0, "blocks": 0}

    def rounded(x, rule):
        kind, k = rule
        n = x.shape[-1]
        xb = x.reshape(-1, n // 32, 32).float()
        amax = xb.abs().amax(-1, keepdim=True)
        d = amax / 127.0
        t = xb * torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
        q1 = torch.round(t)  # ties to even, as act.c
        if kind == "int8":
            return (q1 * d).reshape(x.shape).to(x.dtype)
        q2 = torch.clamp(torch.round((t - q1) * 256.0), -127, 127)
        keep = torch.ones_like(amax)
        if kind == "drop":
            drop = amax ** 2 * 65536.0 <= k * (amax ** 2).mean(1, keepdim=True)
            keep = (~drop).float()
            state["dropped"] += int(drop.sum())
            state["blocks"] += drop.numel()
        return ((q1 + keep * q2 / 256.0) * d).reshape(x.shape).to(x.dtype)

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

    def logits():
        with torch.inference_mode():
            return [ref(torch.tensor([list(ids)])).logits[0].float().numpy().astype(np.float64)
                    for _, ids in windows]

    def compare(base, got):
        agree = total = 0
        kls = []
        for a, b in zip(base, got):
            la = a - np.logaddexp.reduce(a, axis=1, keepdims=True)
            lb = b - np.logaddexp.reduce(b, axis=1, keepdims=True)
            kls.append((np.exp(la) * (la - lb)).sum(1))
            agree += int((a.argmax(1) == b.argmax(1)).sum())
            total += a.shape[0]
        return 100.0 * agree / total, float(np.concatenate(kls).mean()), total

    base = logits()
    variants = [("int16 everywhere", ("int16", 0)), ("int8 everywhere", ("int8", 0))]
    variants += [(f"int8 on {g}", ("mix", tuple(p for p in g.split(",") if p)))
                 for g in args.int8_on.split(";") if g]
    variants += [(f"level 2 dropped, k = {k}", ("drop", float(k))) for k in args.drop_k.split(",") if k]
    print(f"model {path.name}: {len(windows)} texts")
    print("| variant | top-1 | mean KL (nats) | blocks dropped |\n|---|---:|---:|---:|")
    for label, rule in variants:
        state.update(rule=rule, dropped=0, blocks=0)
        top1, kl, total = compare(base, logits())
        share = f"{100.0 * state['dropped'] / state['blocks']:.1f}%" if state["blocks"] else ""
        print(f"| {label} | {top1:.2f}% | {kl:.2e} | {share} |", flush=True)
    print(f"({total} positions)")


if __name__ == "__main__":
    main()
