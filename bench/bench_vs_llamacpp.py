"""qwenc against llama.cpp (through llama-cpp-python) on the same GGUF, in the same run.

    python bench/bench_vs_llamacpp.py [--model GGUF] [--threads 2] [--prompt 128,512] [--gen 64]
                                      [--repeats 5] [--dtype none,q8_0] [--activations f32,int16]
                                      [--flash-attn] [--json OUT]

llama-cpp-python is a benchmark peer only, not a dependency of qwenc: `pip install
llama-cpp-python` (it compiles llama.cpp for this CPU; see bench/README.md).

Both engines get the same file, the same thread count (kernels and batch), the same prompt token
ids and the same context size, and do the same work: forward passes over token ids producing the
last position's logits, with a greedy argmax in numpy. No sampler, no tokenizer and no text
decoding is timed.

What is timed, per prompt length P:
  prefill P  one call that runs P prompt tokens through the model on an empty cache, up to and
             including the logits of the last position (only that row).
               qwenc:     model.forward(seq, ids) on a fresh model.new_sequence(), allocated
                          before the clock starts (qwenc prefills in chunks of 512 tokens).
               llama.cpp: Llama.eval(ids) right after Llama.reset() (eval first drops the cached
                          positions >= 0); n_batch = n_ubatch = 512, so P <= 512 is one
                          llama_decode.
  decode @P  G steps, each one new token at the end of the cache (positions P .. P+G-1) and
             np.argmax over its logits, the argmax feeding the next step (greedy). Starts from
             the argmax of the prefill's logits, right after that prefill.
               qwenc:     int(np.argmax(model.forward(seq, [token])))
               llama.cpp: llm.eval([token]); int(np.argmax(<view of llama_get_logits>))
  Rates are tokens / seconds (perf_counter around the calls above).

Runs are interleaved: for each repeat and each prompt length, every engine runs once, the order
reversed on odd repeats (A B, B A, ...), so drift in the machine's load hits all engines alike.
One untimed warm-up per engine first (it also faults in the memory-mapped weights). The table
shows medians and [min - max] over the repeats, and qwenc / llama.cpp ratios of the medians.

On a shared machine other processes steal CPU time mid-run, and a 2-thread engine whose thread
is descheduled stalls at every barrier. So each run (a prefill and its decode) measures the CPU
time other processes used meanwhile (/proc/stat minus our own getrusage); a run during which
they took more than --max-foreign of the CPUs is redone (up to --retries times), and every run
first waits (up to 60 s) for half a second that quiet. The report gives that share for the kept
runs.

The roofline: decode reads every weight matrix once per token (the embedding one row), so the
best decode rate is read bandwidth / weight bytes per token (qwenc.bench). Each engine's decode
median is shown as a share of that, and as the bandwidth it implies.

Prompt: the source text of Python's argparse module, tokenized by the model's tokenizer (qwenc's)
and cut to P tokens; --random-prompt uses seeded random ids instead. The greedy continuations of
the two engines are compared as a sanity check (they may diverge after a near-tie in the logits:
their rounding differs, e.g. in how activations are quantized to 8 bits for the products).

--profile (qwenc only; --repeats 0 skips the comparison) splits qwenc's decode step: the step
re-implemented with each kernel call timed (summed per kernel family over the layers); the step
of a tiny model with the same layer count (the per-token cost that does not grow with the
weights), at N threads and at 1; every matmul family alone at M = 1, "cold" (caches flushed
before each product) and "cached" (the same product repeated at once: if that is not faster,
the kernel is compute-bound, not memory-bound); and the attention kernel at a few context sizes.
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout


# ---------------------------------------------------------------- engines

class QwencEngine:
    def __init__(self, path, threads, context, dtype, activations="f32"):
        import qwenc
        self.name = " ".join(["qwenc"] + ([dtype] if dtype else []) + ([activations] if activations != "f32" else []))
        t = time.perf_counter()
        self.model = qwenc.load(path, dtype=dtype, threads=threads, context=context, activations=activations)
        self.load_s = time.perf_counter() - t
        self.seq = None

    def prefill(self, ids):
        """Seconds for the prefill of ids on a fresh cache, and the greedy next token."""
        self.seq = self.model.new_sequence()
        t0 = time.perf_counter()
        logits = self.model.forward(self.seq, ids)
        t1 = time.perf_counter()
        return t1 - t0, int(np.argmax(logits))

    def decode(self, token, n):
        """Seconds for n greedy decode steps from token, and the tokens produced."""
        forward, seq, out = self.model.forward, self.seq, []
        t0 = time.perf_counter()
        for _ in range(n):
            token = int(np.argmax(forward(seq, [token])))
            out.append(token)
        t1 = time.perf_counter()
        return t1 - t0, out


class LlamaEngine:
    def __init__(self, path, threads, context, flash_attn):
        from llama_cpp import Llama
        self.name = "llama.cpp"
        t = time.perf_counter()
        self.llm = Llama(model_path=str(path), n_threads=threads, n_threads_batch=threads, n_ctx=context,
                         n_batch=512, n_ubatch=512, flash_attn=flash_attn, verbose=False)
        self.load_s = time.perf_counter() - t
        self.n_vocab = self.llm.n_vocab()

    def _logits(self):
        # a view of the context's output row: no copy, as qwenc's forward returns its own array
        return np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.n_vocab,))

    def prefill(self, ids):
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.eval(ids)
        token = int(np.argmax(self._logits()))
        t1 = time.perf_counter()
        return t1 - t0, token

    def decode(self, token, n):
        llm, logits, out = self.llm, self._logits, []
        t0 = time.perf_counter()
        for _ in range(n):
            llm.eval([token])
            token = int(np.argmax(logits()))
            out.append(token)
        t1 = time.perf_counter()
        return t1 - t0, out


def llama_info():
    import llama_cpp
    info = llama_cpp.llama_print_system_info()
    info = info.decode() if isinstance(info, bytes) else str(info)
    return f"llama-cpp-python {llama_cpp.__version__} ({Path(llama_cpp.__file__).parent}): {info.strip()}"


def cpu_line():
    """The ISA each side uses: qwenc's integer products and attention take AVX-512 where the CPU
    has it, its other kernels AVX2 at most; a native llama.cpp build uses AVX-512 (and VNNI)
    where the CPU has it."""
    from qwenc.bench import kernel_path
    flags = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    wide = " ".join(f for f in ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx_vnni")
                    if f in flags)
    return f"qwenc SIMD path: {kernel_path()}; CPU AVX-512/VNNI flags: {wide or 'none'}"


# ---------------------------------------------------------------- other processes' CPU use

class ForeignLoad:
    """CPU time used by other processes while we run: all CPUs' busy time (/proc/stat) minus this
    process's own (getrusage, all threads), as a share of the machine's capacity. On a shared
    machine this tells a clean run from a disturbed one. Inactive where /proc/stat is missing."""
    HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def __init__(self):
        self.ok = Path("/proc/stat").is_file()
        self.ncpu = os.cpu_count() or 1

    def sample(self):
        import resource
        if not self.ok:
            return None
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        busy = (sum(v[:8]) - v[3] - v[4]) / self.HZ  # all but idle and iowait (guest is in user)
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return time.perf_counter(), busy, ru.ru_utime + ru.ru_stime

    def share(self, a, b):
        """Other processes' share of all CPUs between two samples (0..1), or 0 when unknown."""
        if a is None or b is None or b[0] <= a[0]:
            return 0.0
        foreign = (b[1] - a[1]) - (b[2] - a[2])
        return max(0.0, foreign / ((b[0] - a[0]) * self.ncpu))

    def wait_quiet(self, limit, max_wait):
        """Sleep until other processes use less than `limit` of the CPUs over half a second."""
        t_end = time.perf_counter() + max_wait
        while self.ok:
            a = self.sample()
            time.sleep(0.5)
            if self.share(a, self.sample()) < limit or time.perf_counter() > t_end:
                return


# ---------------------------------------------------------------- prompt

def prompt_ids(model, n, random_ids, seed=0):
    """n token ids: real text (argparse's source) tokenized, or seeded random ids."""
    tok = model.tokenizer
    if random_ids or tok is None:
        return np.random.default_rng(seed).integers(0, model.n_vocab, n).tolist()
    text = Path(argparse.__file__).read_text(encoding="utf-8")
    ids = tok.encode(text, allow_special=False)
    while len(ids) < n:
        ids = ids + ids
    return [int(t) for t in ids[:n]]


# ---------------------------------------------------------------- qwenc decode profile (--profile)

def _timed(acc, key, fn, *a):
    t = time.perf_counter()
    r = fn(*a)
    acc[key] = acc.get(key, 0.0) + time.perf_counter() - t
    return r


def _type_name(code):
    from qwenc.formats.tensors import DTYPE_NAMES
    return DTYPE_NAMES.get(code % 256, str(code)) + ("/R8" if code >= 256 else "")


class _TimedOps:
    """Stands in for qwenc._ops in the forward pass: every kernel call timed into acc, matrix
    products by type and shape."""

    def __init__(self, ops, acc):
        self._ops, self._acc = ops, acc

    def __getattr__(self, name):
        f = getattr(self._ops, name)
        if not callable(f):
            return f

        def timed(*a, **k):
            if name == "matmul":
                key = f"matmul {_type_name(a[1])} {a[2]}x{a[3]}"
            elif name == "matmul_group":
                key = "matmul group " + " + ".join(f"{_type_name(p[1])} {p[2]}" for p in a[0]) + f" x{a[1].shape[1]}"
            else:
                key = name
            return _timed(self._acc, key, f, *a, **k)
        return timed


def instrumented_step(model, seq, token, acc):
    """One decode step (model.forward of one token, then argmax) with every kernel call the
    forward pass makes timed into acc[name]; the rest of the step is Python. Returns the greedy
    next token."""
    import qwenc.model.forward as fwd
    import qwenc.model.weights as wmod
    from qwenc import _ops
    proxy = _TimedOps(_ops, acc)
    fwd._ops = wmod._ops = proxy
    try:
        t = time.perf_counter()
        logits = model.forward(seq, [token])
        acc["whole step"] = acc.get("whole step", 0.0) + time.perf_counter() - t
    finally:
        fwd._ops = wmod._ops = _ops
    return int(_timed(acc, "argmax (numpy)", np.argmax, logits))


def tiny_model(cfg, threads):
    """A qwenc Model with cfg's layer count, head counts and biases but tiny matrices (hidden 64,
    head_dim 8, intermediate 128, vocab 512, F32): its decode step is almost only the per-token
    cost that does not scale with the weights (Python, Cython wrappers, OpenMP fork/join)."""
    import qwenc
    from qwenc.formats.config import config_from_dict
    from qwenc.model import Weights
    from qwenc.formats.tensors import F32, Tensor
    d = {"model_type": cfg.arch, "hidden_size": 64, "num_hidden_layers": cfg.num_layers,
         "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads, "head_dim": 8,
         "intermediate_size": 128, "vocab_size": 512, "rope_theta": cfg.rope_theta,
         "attention_bias": cfg.attention_bias, "tie_word_embeddings": False}
    tc = config_from_dict(d, "tiny")
    rng = np.random.default_rng(0)
    tensors = {}

    def add(name, *shape):
        x = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        tensors[name] = Tensor(name, F32, shape, x.reshape(-1).view(np.uint8), "tiny")

    h, q, kv, i = tc.hidden_size, tc.q_size, tc.kv_size, tc.intermediate_size
    add("model.embed_tokens.weight", tc.vocab_size, h)
    add("lm_head.weight", tc.vocab_size, h)
    add("model.norm.weight", h)
    for li in range(tc.num_layers):
        p = f"model.layers.{li}."
        for n, shape in (("input_layernorm.weight", (h,)), ("post_attention_layernorm.weight", (h,)),
                         ("self_attn.q_proj.weight", (q, h)), ("self_attn.q_proj.bias", (q,)),
                         ("self_attn.k_proj.weight", (kv, h)), ("self_attn.k_proj.bias", (kv,)),
                         ("self_attn.v_proj.weight", (kv, h)), ("self_attn.v_proj.bias", (kv,)),
                         ("self_attn.o_proj.weight", (h, q)), ("self_attn.q_norm.weight", (8,)),
                         ("self_attn.k_norm.weight", (8,)), ("mlp.gate_proj.weight", (i, h)),
                         ("mlp.up_proj.weight", (i, h)), ("mlp.down_proj.weight", (h, i))):
            add(p + n, *shape)
    return qwenc.Model(tc, Weights(tc, tensors), threads=threads, context=1024)


def decode_step_times(model, prompt, steps):
    """Seconds per plain decode step (model.forward of one token + argmax) after `prompt`."""
    seq = model.new_sequence(len(prompt) + steps + 1)
    token = int(np.argmax(model.forward(seq, prompt)))
    out = []
    for _ in range(steps):
        t = time.perf_counter()
        token = int(np.argmax(model.forward(seq, [token])))
        out.append(time.perf_counter() - t)
    return out


def flush_caches(buf):
    int(buf.sum())  # read a buffer larger than L3: evicts the weights just used


def matmul_rates(model, repeats, run):
    """Per weight family (role, type, shape): seconds per token over all layers with the weights
    coming from DRAM (caches flushed before each product) and from cache (the same product run
    again at once), and the bytes involved. `run(fn)` runs one timed pass (see clean_run)."""
    w = model.weights
    fam = {}
    for layer in w.layers:
        for role in ("q", "k", "v", "o", "gate", "up", "down"):
            lin = getattr(layer, role)
            if lin is None:  # an expert layer's MLP: its experts are not split out here
                continue
            t = lin.weight
            fam.setdefault(f"matmul {role:7s} {_type_name(t.dtype)} {t.shape[0]}x{t.shape[1]}", []).append(lin)
    t = w.lm_head
    fam[f"matmul {'lm_head':7s} {_type_name(t.dtype)} {t.shape[0]}x{t.shape[1]}"] = [w.head]
    act = model.transformer._act
    buf = np.ones(8 << 20, np.uint64)  # 64 MiB
    out = {}
    for key, lins in fam.items():
        x = np.random.default_rng(0).standard_normal((1, lins[0].weight.shape[1])).astype(np.float32)
        y = np.empty((1, lins[0].weight.shape[0]), np.float32)

        def one_pass():
            c = h = 0.0
            for lin in lins:
                flush_caches(buf)
                t0 = time.perf_counter()
                lin(x, y, act)
                t1 = time.perf_counter()
                lin(x, y, act)
                t2 = time.perf_counter()
                c += t1 - t0
                h += t2 - t1
            return c, h

        passes = [run(one_pass) for _ in range(repeats)]
        nbytes = sum((lin.packed if lin.packed is not None else lin.weight).data.nbytes for lin in lins)
        out[key] = (statistics.median(c for c, _ in passes), statistics.median(h for _, h in passes), nbytes, len(lins))
    return out


def attention_times(model, contexts, repeats=20):
    """Seconds per token of the attention kernel over all layers at the given context lengths
    (one query row over a paged cache of that many positions)."""
    from qwenc import _ops
    cfg = model.config
    bs = 16
    res = {}
    q = np.random.default_rng(0).standard_normal((1, cfg.num_heads, cfg.head_dim)).astype(np.float32)
    o = np.empty_like(q)
    for n in contexts:
        blocks = n // bs + 1
        # the pools as the model keeps them: keys transposed within a block, in its KV dtype
        kv = _ops.KV_DTYPES[model.transformer.kv_dtype]
        rng = np.random.default_rng(1)
        Kc = rng.standard_normal((cfg.num_kv_heads, blocks, cfg.head_dim, bs)).astype(kv)
        Vc = rng.standard_normal((cfg.num_kv_heads, blocks, bs, cfg.head_dim)).astype(kv)
        table = np.arange(blocks, dtype=np.int32)[None]
        row_seq, row_pos = np.zeros(1, np.int32), np.array([n], np.int64)
        ts = []
        for _ in range(repeats):
            t = time.perf_counter()
            _ops.paged_attention(q, Kc, Vc, table, row_seq, row_pos, model.transformer.scale, o)
            ts.append(time.perf_counter() - t)
        res[n] = statistics.median(ts) * cfg.num_layers
    return res


def clean_run(args, fn, shares):
    """fn(), run again (up to args.retries times) while other processes took more than
    args.max_foreign of the CPUs during it; the share of the kept run is appended to shares."""
    fl = ForeignLoad()
    for attempt in range(args.retries + 1):
        if args.max_foreign < 1:
            fl.wait_quiet(args.max_foreign, max_wait=60)
        a = fl.sample()
        r = fn()
        share = fl.share(a, fl.sample())
        if share <= args.max_foreign or attempt == args.retries:
            shares.append(share)
            return r


def profile(args, model, prompt, gbs, label):
    """Where a qwenc decode step's time goes."""
    from qwenc.bench import weight_bytes_per_token
    steps = max(16, args.gen)
    ms = 1e3
    shares = []
    run = lambda fn: clean_run(args, fn, shares)  # noqa: E731
    print(f"\n== decode profile of {label}: {model.name}, threads {args.threads}, "
          f"decode after a {len(prompt)}-token prompt, {steps} steps")
    step = statistics.median(run(lambda: decode_step_times(model, prompt, steps)))

    def instrumented():
        seq = model.new_sequence(len(prompt) + steps + 2)
        token = int(np.argmax(model.forward(seq, prompt)))
        acc = {}
        for _ in range(steps):
            token = instrumented_step(model, seq, token, acc)
        return {k: v / steps for k, v in acc.items()}

    acc = run(instrumented)
    from qwenc import _ops
    tiny_ids = [t % 512 for t in prompt]
    tiny_m = tiny_model(model.config, 1)  # sets the kernels' thread count (process-wide)
    tiny1 = statistics.median(run(lambda: decode_step_times(tiny_m, tiny_ids, steps * 4)))
    tiny_m = tiny_model(model.config, args.threads)
    tiny = statistics.median(run(lambda: decode_step_times(tiny_m, tiny_ids, steps * 4)))
    _ops.set_threads(args.threads)
    whole = acc.pop("whole step")
    acc["Python and numpy between kernels"] = whole - sum(v for k, v in acc.items() if k != "argmax (numpy)")
    kernels = sum(acc.values())
    print(f"plain decode step   {step * ms:7.2f} ms = {1 / step:5.1f} tok/s (median of {steps}); "
          f"instrumented step sum {kernels * ms:.2f} ms")
    print(f"tiny model with the same {model.config.num_layers} layers (per-token cost that does not scale "
          f"with the weights): {tiny * ms:.2f} ms/step at {args.threads} threads, {tiny1 * ms:.2f} ms at 1 "
          f"thread (Python + Cython; the difference is OpenMP fork/join)")
    print(f"{'inside the real step (instrumented)':44} {'ms/tok':>8} {'share':>6}")
    for k, v in sorted(acc.items(), key=lambda kv: -kv[1]):
        print(f"  {k:42} {v * ms:8.3f} {100 * v / kernels:5.1f}%")
    rates = matmul_rates(model, max(3, args.repeats), run)
    wb = weight_bytes_per_token(model)
    print(f"\nmatmul families in isolation, M=1, {args.threads} threads (all layers summed; cold = caches "
          f"flushed before each product, cached = the same product again at once):")
    print(f"  {'family':38} {'n':>3} {'MB':>7} {'cold ms':>8} {'GB/s':>6} {'cached ms':>9} {'GB/s':>6} "
          f"{'roof ms':>8}")
    tot_c = tot_h = tot_r = 0.0
    for k, (c, h, nb, n) in sorted(rates.items(), key=lambda kv: -kv[1][0]):
        roof = nb / (gbs * 1e9)
        tot_c, tot_h, tot_r = tot_c + c, tot_h + h, tot_r + roof
        print(f"  {k:38} {n:3d} {nb / 1e6:7.1f} {c * ms:8.2f} {nb / c / 1e9:6.1f} {h * ms:9.2f} "
              f"{nb / h / 1e9:6.1f} {roof * ms:8.2f}")
    print(f"  {'all matmuls':38} {'':3} {wb / 1e6:7.1f} {tot_c * ms:8.2f} {wb / tot_c / 1e9:6.1f} "
          f"{tot_h * ms:9.2f} {wb / tot_h / 1e9:6.1f} {tot_r * ms:8.2f}")
    print(f"  (roof ms = the family's bytes at the measured {gbs:.1f} GB/s)")
    ctxs = sorted({len(prompt), 512, 2048})
    at = run(lambda: attention_times(model, ctxs))
    print("attention kernel, all layers: " + ", ".join(f"context {n}: {t * ms:.2f} ms" for n, t in at.items()))
    print(f"other processes' share of the CPUs during the kept measurements: median "
          f"{100 * statistics.median(shares):.0f}%, max {100 * max(shares):.0f}%")


# ---------------------------------------------------------------- report

def stats(xs):
    return statistics.median(xs), min(xs), max(xs)


def fmt_cell(xs):
    med, lo, hi = stats(xs)
    return f"{med:8.1f} [{lo:6.1f}-{hi:6.1f}]"


def leading_agreement(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="GGUF file (default: the demo model)")
    ap.add_argument("--threads", type=int, default=2, help="threads for both engines (default 2)")
    ap.add_argument("--prompt", default="128,512", help="prompt lengths in tokens, comma-separated (default 128,512)")
    ap.add_argument("--gen", type=int, default=64, help="decode steps after each prompt (default 64)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per engine and prompt (default 5)")
    ap.add_argument("--dtype", default="none",
                    help="qwenc weight modes, comma-separated: none (as stored), q8_0, bf16, f32 (default none)")
    ap.add_argument("--activations", default="f32",
                    help="qwenc activation modes, comma-separated: f32, int16, int8 (default f32)")
    ap.add_argument("--flash-attn", action="store_true", help="llama.cpp with flash attention (binding default: off)")
    ap.add_argument("--no-llama", action="store_true", help="qwenc only (no llama-cpp-python needed)")
    ap.add_argument("--random-prompt", action="store_true", help="seeded random ids instead of real text")
    ap.add_argument("--max-foreign", type=float, default=0.15,
                    help="a run during which other processes used more than this share of the CPUs is "
                         "run again (and each run waits up to 60 s for such a quiet moment); 1 = off (default 0.15)")
    ap.add_argument("--retries", type=int, default=4, help="most reruns of one disturbed run (default 4)")
    ap.add_argument("--json", help="also write every run's timings to this file")
    ap.add_argument("--profile", action="store_true",
                    help="then profile qwenc's decode step (per kernel family; --repeats 0 skips the comparison)")
    args = ap.parse_args()

    import qwenc
    from qwenc.bench import measure_bandwidth, weight_bytes_per_token
    if args.model is None:
        from qwenc.formats.demo import demo_model_path
        args.model = str(demo_model_path())
    else:  # a name qwenc knows (demo-1.5b, a hub id) as the file llama.cpp is given too
        from qwenc.formats.resolve import resolve_model_path
        args.model = str(resolve_model_path(args.model))
    prompts = [int(p) for p in args.prompt.split(",")]
    dtypes = [None if d in ("none", "") else d for d in args.dtype.split(",")]
    context = max(prompts) + args.gen + 8
    use_llama = not args.no_llama and args.repeats > 0
    if use_llama:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            sys.exit("llama-cpp-python is not installed: pip install llama-cpp-python (or pass --no-llama)")

    acts = args.activations.split(",")
    engines = [QwencEngine(args.model, args.threads, context, d, a) for d in dtypes for a in acts]
    stored = engines[0].model if dtypes[0] is None else qwenc.load(args.model, threads=args.threads, context=8)
    if use_llama:
        engines.append(LlamaEngine(args.model, args.threads, context, args.flash_attn))
    ids = {p: prompt_ids(stored, p, args.random_prompt) for p in prompts}
    cfg = stored.config
    print(f"model    {args.model}")
    print(f"         {cfg.num_layers} layers, hidden {cfg.hidden_size}, vocab {cfg.vocab_size}")
    print(f"threads  {args.threads}   prompts {prompts}   gen {args.gen}   repeats {args.repeats} "
          f"(interleaved, order reversed every other repeat)   context {context}")
    print(cpu_line())
    if use_llama:
        print(llama_info())
        print(f"llama.cpp: n_batch = n_ubatch = 512, flash_attn {'on' if args.flash_attn else 'off'}")
    for e in engines:
        print(f"load     {e.name}: {e.load_s:.2f} s")

    gbs = None
    if args.repeats > 0:
        res = compare(args, engines, prompts, ids, lambda: clean_run(args, measure_bandwidth, []))
        gbs = statistics.median(res["bandwidth"])
        bytes_tok = {e.name: weight_bytes_per_token(e.model if isinstance(e, QwencEngine) else stored)
                     for e in engines}
        report(args, engines, prompts, res, gbs, bytes_tok)
        if args.json:
            out = {"model": args.model, "threads": args.threads, "prompts": prompts, "gen": args.gen,
                   "repeats": args.repeats, "load_before": res["load_before"], "load_after": res["load_after"],
                   "bandwidth_gbs": gbs, "bandwidth_gbs_per_repeat": res["bandwidth"],
                   "weight_bytes_per_token": bytes_tok,
                   "prefill_tok_s": {f"{n}@{p}": v for (n, p), v in res["prefill"].items()},
                   "decode_tok_s": {f"{n}@{p}": v for (n, p), v in res["decode"].items()},
                   "foreign_cpu_share": {f"{n}@{p}": v for (n, p), v in res["foreign"].items()},
                   "runs_redone": res["redone"]}
            if use_llama:
                out["llama"] = llama_info()
            Path(args.json).write_text(json.dumps(out, indent=1))
    if use_llama:
        engines.pop().llm.close()  # free its memory before profiling

    if args.profile:
        if gbs is None:
            gbs = clean_run(args, measure_bandwidth, [])
            print(f"\nread bandwidth {gbs:.1f} GB/s (qwenc.bench.measure_bandwidth, {args.threads} threads)")
        print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for e in engines:
            profile(args, e.model, ids[prompts[0]], gbs, e.name)
        print(f"load average after profiling {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def compare(args, engines, prompts, ids, probe):
    """The interleaved runs: tok/s lists per (engine, prompt), the last greedy tokens, and the
    bandwidth probe's GB/s after each repeat. Other tenants of a shared machine load its memory
    by turns (the probe has read 31 to 60 GB/s within an hour on one machine): a decode's share
    of the roofline is taken against the probe of its own repeat, not one probe for all."""
    load_before = os.getloadavg()
    # warm-up: every engine once (faults in the mmapped weights, starts the thread pools)
    for e in engines:
        _, tok = e.prefill(ids[prompts[0]])
        e.decode(tok, min(8, args.gen))
    prefill = {(e.name, p): [] for e in engines for p in prompts}
    decode = {(e.name, p): [] for e in engines for p in prompts}
    foreign = {(e.name, p): [] for e in engines for p in prompts}
    tokens = {}
    fl = ForeignLoad()
    redone = 0
    bandwidth = []
    for r in range(args.repeats):
        for p in prompts:
            for e in (engines if r % 2 == 0 else engines[::-1]):
                for attempt in range(args.retries + 1):
                    if args.max_foreign < 1:
                        fl.wait_quiet(args.max_foreign, max_wait=60)
                    a = fl.sample()
                    s_pre, tok = e.prefill(ids[p])
                    s_dec, out = e.decode(tok, args.gen)
                    share = fl.share(a, fl.sample())
                    if share <= args.max_foreign or attempt == args.retries:
                        break
                    redone += 1  # another process took CPU during the run: run it again
                prefill[e.name, p].append(p / s_pre)
                decode[e.name, p].append(args.gen / s_dec)
                foreign[e.name, p].append(share)
                tokens[e.name, p] = [tok] + out
        bandwidth.append(probe())
        print(f"  repeat {r + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    return {"prefill": prefill, "decode": decode, "foreign": foreign, "tokens": tokens, "redone": redone,
            "bandwidth": bandwidth,
            "load_before": load_before, "load_after": os.getloadavg()}


def report(args, engines, prompts, res, gbs, bytes_tok):
    prefill, decode, tokens = res["prefill"], res["decode"], res["tokens"]
    lb, la = res["load_before"], res["load_after"]
    names = [e.name for e in engines]
    ref = "llama.cpp" if "llama.cpp" in names else None
    w = 27
    print()
    print(f"load average  before {lb[0]:.2f} {lb[1]:.2f} {lb[2]:.2f}   after {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}")
    fo = [x for v in res["foreign"].values() for x in v]
    print(f"other processes' share of the CPUs during the kept runs: median {100 * statistics.median(fo):.0f}%, "
          f"max {100 * max(fo):.0f}%; runs redone for exceeding {100 * args.max_foreign:.0f}%: {res['redone']}")
    print("tok/s, median [min-max] of", args.repeats)
    head = f"{'':14}" + "".join(f"{n:>{w}}" for n in names)
    if ref:
        head += "".join(f"{n + '/llama':>18}" for n in names if n != ref)
    print(head)
    for kind, table in (("prefill", prefill), ("decode", decode)):
        for p in prompts:
            label = f"prefill {p}" if kind == "prefill" else f"decode @{p}"
            row = f"{label:14}" + "".join(f"{fmt_cell(table[n, p]):>{w}}" for n in names)
            if ref:
                base = statistics.median(table[ref, p])
                row += "".join(f"{statistics.median(table[n, p]) / base:17.2f}x" for n in names if n != ref)
            print(row)

    # roofline
    print()
    bw = res["bandwidth"]
    print(f"read bandwidth {gbs:.1f} GB/s, median [{min(bw):.1f}-{max(bw):.1f}] of the probes after each repeat "
          f"(qwenc.bench.measure_bandwidth, {args.threads} threads); each decode's share against its repeat's probe")
    for n in names:
        roof = gbs * 1e9 / bytes_tok[n]
        shares = ", ".join(
            f"decode @{p}: {100 * statistics.median(t * bytes_tok[n] / 1e9 / b for t, b in zip(decode[n, p], bw)):.0f}% "
            f"({statistics.median(decode[n, p]) * bytes_tok[n] / 1e9:.1f} GB/s)" for p in prompts)
        print(f"{n:12} weights {bytes_tok[n] / 1e9:.3f} GB/token -> roofline {roof:.1f} tok/s;  {shares}")

    # sanity: same model, same greedy continuation (up to near-ties)
    if ref:
        for n in names:
            if n != ref:
                agree = ", ".join(f"@{p}: {leading_agreement(tokens[n, p], tokens[ref, p])}/{args.gen + 1}"
                                  for p in prompts)
                print(f"greedy tokens identical to llama.cpp's before the first difference ({n}): {agree}")


if __name__ == "__main__":
    main()
