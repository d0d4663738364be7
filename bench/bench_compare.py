"""The full speed comparison the README shows: qwenc's activation modes, llama.cpp and transformers
on the same GGUF files, and qwenc's batched decode.

    python bench/bench_compare.py [--models demo,/path/to/1.5b.gguf] [--threads 2] [--repeats 3]
                                  [--out bench/RESULTS.md] [--readme] [--quick]

(`make bench-compare` runs it with --readme.) Per model:
  - qwenc f32 / int16 / int8 and llama.cpp, interleaved in one process (bench_vs_llamacpp.py
    --json): prefill 128 and 512, decode after each;
  - transformers on the same GGUF, dequantized to float32 (what the f32 mode computes): prefill
    128 and 32 decode steps, torch at the same thread count, run after the others;
  - batched decode of the default mode (bench_batched_decode.py) on the first model;
  - peak RSS of qwenc's default mode and of llama.cpp, each in a fresh process, after a 4,096-token
    prompt (bench_memory.py).
The result is a markdown block with the date, the CPU, its SIMD flags and the commit, written
between the `bench-compare` markers of --out (other sections of that file are kept; a file
without markers is replaced); --readme also puts it into README.md between the same markers.
Every figure is a median over the repeats of runs made in this invocation; nothing is carried
over from earlier runs.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARK_START, MARK_END = "<!-- bench-compare:start -->", "<!-- bench-compare:end -->"


def cpu_description():
    model, flags = platform.processor() or "?", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model in ("?", "x86_64", ""):
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                have = set(line.split(":", 1)[1].split())
                flags = " ".join(f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                                             "avx_vnni", "amx_tile", "amx_int8", "amx_bf16") if f in have)
    except OSError:
        pass
    return f"{model} ({os.cpu_count()} CPUs; {flags or 'flags unknown'})"


def commit():
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return out.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    except OSError:
        return "?"


def run_vs_llama(model, threads, repeats, prompts, gen, max_foreign):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [sys.executable, str(ROOT / "bench" / "bench_vs_llamacpp.py"), "--model", model, "--threads", str(threads),
           "--repeats", str(repeats), "--prompt", ",".join(map(str, prompts)), "--gen", str(gen),
           "--activations", "f32,int16,int8", "--json", out, "--max-foreign", str(max_foreign)]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    try:
        subprocess.run(cmd, check=True, stdout=sys.stderr)
        return json.loads(Path(out).read_text())
    finally:
        Path(out).unlink(missing_ok=True)


def transformers_speed(model, threads, prompt, gen, repeats):
    """(prefill tok/s, decode tok/s) medians for transformers' float32 model of the GGUF."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(threads)
    p = Path(model)
    ref = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch.float32).eval()
    rng = np.random.default_rng(0)
    pre, dec = [], []
    with torch.inference_mode():
        for _ in range(repeats):
            ids = torch.tensor([rng.integers(0, 150000, prompt).tolist()])
            t0 = time.perf_counter()
            out = ref(input_ids=ids, use_cache=True)
            t1 = time.perf_counter()
            cache = out.past_key_values
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            t2 = time.perf_counter()
            for _ in range(gen):
                out = ref(input_ids=tok, past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                tok = out.logits[:, -1].argmax(-1, keepdim=True)
            t3 = time.perf_counter()
            pre.append(prompt / (t1 - t0))
            dec.append(gen / (t3 - t2))
    del ref
    return statistics.median(pre), statistics.median(dec)


def run_batched(model, threads, repeats):
    cmd = [sys.executable, str(ROOT / "bench" / "bench_batched_decode.py"), "--model", model, "--threads", str(threads),
           "--repeats", str(repeats), "--activations", "f32,int16,int8"]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    r = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return [line for line in r.stdout.splitlines() if line.startswith("|")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="demo", help="comma-separated GGUF paths or names qwenc resolves (demo, demo-1.5b)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "RESULTS.md"))
    ap.add_argument("--readme", action="store_true", help="also replace the table in README.md")
    ap.add_argument("--max-foreign", type=float, default=0.15,
                    help="bench_vs_llamacpp.py's limit on other processes' CPU share during a run (1 = off)")
    ap.add_argument("--quick", action="store_true", help="prompt 128 only, 32 decode steps, 1 repeat (a smoke run)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    prompts, gen, repeats = ([128], 32, 1) if args.quick else ([128, 512], 64, args.repeats)
    # names qwenc knows (demo, demo-1.5b, a hub id) as the files every engine is given
    from qwenc.formats.resolve import resolve_model_path
    models = [str(resolve_model_path(m)) for m in args.models.split(",") if m]
    lines = [f"Measured {datetime.date.today().isoformat()} on {cpu_description()}, commit {commit()}, "
             f"{args.threads} threads, load average at start {os.getloadavg()[0]:.2f}. Medians of {repeats} "
             f"interleaved runs (`make bench-compare`); ratios are against llama.cpp in the same run.", ""]
    foreign = []
    for model in models:
        res = run_vs_llama(model, args.threads, repeats, prompts, gen, args.max_foreign)
        pre, dec = res["prefill_tok_s"], res["decode_tok_s"]
        foreign += [x for v in res["foreign_cpu_share"].values() for x in v]
        names = ["qwenc", "qwenc int16", "qwenc int8", "llama.cpp"]
        tf = transformers_speed(model, args.threads, prompts[0], min(gen, 32), max(1, repeats // 2 + 1))
        lines.append(f"**{Path(model).name}** ({Path(model).stat().st_size / 2**20:.0f} MiB, "
                     f"{res['weight_bytes_per_token']['qwenc'] / 1e9:.3f} GB read per token, "
                     f"bandwidth {res['bandwidth_gbs']:.1f} GB/s)")
        lines.append("")
        lines.append("| test | qwenc f32 | qwenc int16 | qwenc int8 | llama.cpp | transformers f32 |")
        lines.append("|---|---:|---:|---:|---:|---:|")
        for kind, table in (("prefill", pre), ("decode", dec)):
            for p in prompts:
                llama = statistics.median(table[f"llama.cpp@{p}"])
                cells = []
                for n in names[:3]:
                    v = statistics.median(table[f"{n}@{p}"])
                    cells.append(f"{v:.1f} ({v / llama:.2f}x)")
                t = (tf[0] if kind == "prefill" else tf[1]) if p == prompts[0] else None
                tcell = f"{t:.1f}" if t else "-"
                label = f"prefill {p}" if kind == "prefill" else f"decode @{p}"
                lines.append(f"| {label} | " + " | ".join(cells) + f" | {llama:.1f} | {tcell} |")
        lines.append("")
    lines.append(f"Other processes used a median {100 * statistics.median(foreign):.0f}% of the CPUs during the "
                 f"kept runs (max {100 * max(foreign):.0f}%).")
    lines.append("")
    lines.append(f"Batched decode on {Path(models[0]).name} (B sequences, one step each token; "
                 f"tok/s and the ratio to B = 1):")
    lines.append("")
    lines.extend(run_batched(models[0], args.threads, repeats))
    if not args.quick:
        import bench_memory
        lines += ["", f"Peak RSS ({bench_memory.WORKLOAD}):", ""]
        lines += bench_memory.HEADER + [bench_memory.markdown(Path(m).name, bench_memory.measure(m, args.threads))
                                        for m in models]
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    if not out.exists() or not splice(out, text):
        out.write_text(f"{MARK_START}\n{text}{MARK_END}\n")
    if args.readme and not splice(ROOT / "README.md", text):
        print("README.md has no bench-compare markers; left alone", file=sys.stderr)


def splice(path: Path, text: str) -> bool:
    """Put `text` between the bench-compare markers of a file, keeping what lies around them
    (other benchmarks' sections, the README's prose); False when the file has no markers."""
    s = path.read_text()
    if MARK_START not in s or MARK_END not in s:
        return False
    a, b = s.index(MARK_START) + len(MARK_START), s.index(MARK_END)
    path.write_text(s[:a] + "\n" + text + s[b:])
    return True


if __name__ == "__main__":
    main()
