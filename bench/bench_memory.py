"""Peak resident memory of qwenc (default mode) and llama.cpp (llama-cpp-python) on one GGUF, each
in a fresh interpreter doing the same work: load with a context of 4,112 tokens, prefill 4,096
scattered tokens, decode 16. Reported: the kernel's high-water mark (VmHWM) after the work, and
the bound the README states for qwenc, the weight file + the KV cache (float16, both engines'
default) + 100 MiB.

    python bench/bench_memory.py [--model demo|demo-1.5b|PATH] [--threads 2] [--markdown]

Linux only (/proc/self/status).
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONTEXT, PROMPT, GEN = 4096 + 16, 4096, 16
WORKLOAD = f"each engine in a fresh process: context {CONTEXT}, prefill {PROMPT} scattered tokens, decode {GEN}"

QWENC = r"""
import json, sys
import numpy as np
import qwenc
m = qwenc.load(sys.argv[1], context=%(ctx)d, threads=int(sys.argv[2]))
seq = m.new_sequence(%(ctx)d)
tok = int(np.argmax(m.forward(seq, np.random.default_rng(0).integers(0, 150000, %(prompt)d).tolist())))
for _ in range(%(gen)d):
    tok = int(np.argmax(m.forward(seq, [tok])))
kv = sum(a.nbytes for a in seq.cache.k + seq.cache.v)  # the cache as allocated
hwm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"hwm": hwm, "kv": kv, "kv_dtype": m.transformer.kv_dtype}))
""" % {"ctx": CONTEXT, "prompt": PROMPT, "gen": GEN}

LLAMA = r"""
import json, sys
import numpy as np
from llama_cpp import Llama
t = int(sys.argv[2])
m = Llama(model_path=sys.argv[1], n_ctx=%(ctx)d, n_batch=512, n_ubatch=512, n_threads=t, n_threads_batch=t, verbose=False)
logits = lambda: np.ctypeslib.as_array(m._ctx.get_logits(), shape=(m.n_vocab(),))
m.eval(np.random.default_rng(0).integers(0, 150000, %(prompt)d).tolist())
for _ in range(%(gen)d):
    m.eval([int(np.argmax(logits()))])
hwm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"hwm": hwm}))
""" % {"ctx": CONTEXT, "prompt": PROMPT, "gen": GEN}


def peak(script, model, threads):
    """The JSON line one of the scripts above prints, run in a fresh interpreter."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", script, model, str(threads)], capture_output=True, text=True, env=env,
                       timeout=1800)  # a stuck run fails instead of hanging the suite or the comparison
    if r.returncode:
        raise RuntimeError(f"bench_memory: run failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def measure(model, threads):
    q, ll = peak(QWENC, model, threads), peak(LLAMA, model, threads)
    size = Path(model).stat().st_size
    return {"file": size, "kv": q["kv"], "bound": size + q["kv"] + 100 * 2**20, "qwenc": q["hwm"], "llama.cpp": ll["hwm"]}


def markdown(name, r):
    mib = 2**20
    return (f"| {name} | {r['file'] / mib:.0f} MiB | {r['kv'] / mib:.0f} MiB | {r['qwenc'] / mib:.0f} MiB | "
            f"{r['bound'] / mib:.0f} MiB | {r['llama.cpp'] / mib:.0f} MiB |")


HEADER = ["| model | weight file | KV cache (f16) | qwenc peak RSS | bound (file + KV + 100 MiB) | llama.cpp peak RSS |",
          "|---|---:|---:|---:|---:|---:|"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo", help="GGUF path or a name qwenc resolves (demo, demo-1.5b)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from qwenc.formats.resolve import resolve_model_path
    model = str(resolve_model_path(args.model))  # llama.cpp is handed the same file
    r = measure(model, args.threads)
    print("\n".join(HEADER + [markdown(Path(model).name, r)]) if args.markdown else json.dumps(r))


if __name__ == "__main__":
    main()
