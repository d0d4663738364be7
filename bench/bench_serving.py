"""Serving under concurrency: qwenc serve vs llama.cpp's servers on the same GGUF, loopback only.

    python bench/bench_serving.py [--model GGUF] [--concurrency 1,2,4,8,16] [--gen 64]
                                  [--peers qwenc,llama-cpp-python] [--llama-server PATH]
                                  [--repeats 2] [--offline 64] [--json OUT]

Each server runs alone (one at a time: the machine has 2 cores), started as a subprocess bound to
127.0.0.1, warmed up, then driven by C client threads at once for each concurrency level C: every
client sends `--per-client` streaming /v1/completions requests one after another (temperature 0,
max_tokens --gen, a different code-writing prompt each, ~100 tokens). Per level:

  aggregate tok/s   completion tokens of all requests / wall time of the level (tokens counted
                    by re-tokenizing the streamed text with the model's tokenizer, the same way
                    for every server)
  TTFT p50 / p99    send -> first non-empty text chunk, per request
  ITL p50 / p99     gaps between a request's text chunks

Then "TTFT under load": 8 clients streaming long completions while a ninth sends a 200-token
prompt (max_tokens 8); its time to first token, 3 times.

Servers are run in turn and the order flips every repeat (A B, B A); medians over repeats.
Peers: `qwenc` (`python -m qwenc serve`), `llama-cpp-python` (`python -m llama_cpp.server`, which
serves one request at a time), `llama-server` (llama.cpp's own server with --parallel 16 and
continuous batching, when --llama-server points at a binary built from llama.cpp's sources).

--offline N (qwenc only, in process, after the servers): N prompts through Engine.generate vs the
same prompts one by one (Model.generate_tokens), both greedy, --gen tokens each.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

TOPICS = ["a binary search tree", "an LRU cache", "a JSON parser", "Dijkstra's algorithm", "a thread pool",
          "a trie", "merge sort", "a rate limiter", "a bloom filter", "an event bus", "a priority queue",
          "a ring buffer", "matrix multiplication", "a tokenizer", "a markdown renderer", "a CSV reader",
          "a union-find", "a min-heap", "topological sort", "a quadtree"]


def prompt_for(i: int) -> str:
    topic = TOPICS[i % len(TOPICS)]
    return (f"# Task {i}: implement {topic} in Python.\n# Requirements: clear names, docstrings, type hints,\n"
            f"# error handling for bad input, and a small self-test at the bottom.\n"
            f"# Write the complete module below.\n\nfrom __future__ import annotations\n\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, name, cmd, port, env=None):
        self.name, self.port = name, port
        self.url = f"http://127.0.0.1:{port}"
        # stderr goes to a file, not a pipe: llama.cpp logs a lot, and an undrained pipe blocks it
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log,
                                     env={**os.environ, **(env or {})})
        deadline = time.monotonic() + 300
        while True:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"{name} exited: {self.log.read().decode(errors='replace')[-2000:]}")
            try:
                if httpx.get(self.url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{name} did not start")
            time.sleep(0.5)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()  # a TemporaryFile: closing removes it


def start(peer, model, threads, llama_server, max_batch):
    port = free_port()
    if peer == "qwenc":
        cmd = [sys.executable, "-m", "qwenc", "serve", "-m", model, "--port", str(port), "--threads", str(threads),
               "--max-batch", str(max_batch), "--kv-memory", "1GiB", "-q"]
        return ServerProcess(peer, cmd, port, {"PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    if peer == "llama-cpp-python":
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", model, "--port", str(port), "--host",
               "127.0.0.1", "--n_threads", str(threads), "--n_threads_batch", str(threads), "--n_ctx", "4096",
               "--n_batch", "512"]
        return ServerProcess(peer, cmd, port)
    if peer == "llama-server":
        cmd = [llama_server, "-m", model, "--port", str(port), "--host", "127.0.0.1", "-t", str(threads),
               "-tb", str(threads), "-np", str(max_batch), "-c", str(1024 * max_batch), "-cb", "--no-webui"]
        return ServerProcess(peer, cmd, port)
    raise ValueError(peer)


def stream_completion(url, prompt, max_tokens, out):
    """One streaming request; appends (ttft, [chunk times], text) to out."""
    t0 = time.perf_counter()
    times, text = [], []
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    failed = False
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
            failed = r.status_code != 200
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                piece = "".join(c.get("text") or "" for c in chunk.get("choices", []))
                if piece:
                    times.append(time.perf_counter())
                    text.append(piece)
    except httpx.HTTPError:  # a server that drops concurrent streams: counted, its text kept
        failed = True
    out.append((times[0] - t0 if times else None, times, "".join(text), failed))


def pct(xs, q):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def run_level(url, c, per_client, gen, count_tokens, base):
    results = []
    lock = threading.Lock()

    def client(k):
        for j in range(per_client):
            out = []
            stream_completion(url, prompt_for(base + k * per_client + j), gen, out)
            with lock:
                results.extend(out)
    threads = [threading.Thread(target=client, args=(k,)) for k in range(c)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(count_tokens(text) for _, _, text, _ in results)
    itl = [b - a for _, times, _, _ in results for a, b in zip(times, times[1:])]
    ttft = [r[0] for r in results]
    return {"aggregate_tok_s": tokens / wall, "tokens": tokens, "wall_s": wall,
            "ttft_p50": pct(ttft, 0.5), "ttft_p99": pct(ttft, 0.99), "itl_p50": pct(itl, 0.5),
            "itl_p99": pct(itl, 0.99), "requests": len(results),
            "failed": sum(r[3] for r in results)}


def ttft_under_load(url, count_tokens, long_prompt, tries=3):
    out = []
    for k in range(tries):
        stop = threading.Event()

        def background(i):
            while not stop.is_set():
                stream_completion(url, prompt_for(100 + i), 96, [])
        bg = [threading.Thread(target=background, args=(i,)) for i in range(8)]
        for t in bg:
            t.start()
        time.sleep(3.0)  # the 8 streams are decoding
        res = []
        stream_completion(url, long_prompt, 8, res)
        out.append(res[0][0])
        stop.set()
        for t in bg:
            t.join()
    return out


def offline(model_path, threads, n, gen):
    import qwenc
    from qwenc.engine.engine import Engine
    model = qwenc.load(model_path, threads=threads, context=4096)
    prompts = [prompt_for(i) for i in range(n)]
    ids = [model.tokenizer.encode(p) for p in prompts]
    t = time.perf_counter()
    serial = [list(model.generate_tokens(x, max_tokens=gen, temperature=0)) for x in ids]
    t_serial = time.perf_counter() - t
    with Engine(model, max_batch=16, kv_memory="1GiB") as engine:
        t = time.perf_counter()
        batched = engine.generate(ids, max_tokens=gen, temperature=0)
        t_batch = time.perf_counter() - t
    same = sum(b.token_ids == s for b, s in zip(batched, serial))
    toks = sum(len(s) for s in serial)
    return {"prompts": n, "tokens": toks, "one_by_one_s": t_serial, "engine_s": t_batch,
            "speedup": t_serial / t_batch, "identical": same}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="GGUF file (default: the demo model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--per-client", type=int, default=2, help="requests each client sends per level")
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--peers", default="qwenc,llama-cpp-python")
    ap.add_argument("--llama-server", help="path to llama.cpp's llama-server binary (adds the peer)")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-ttft-load", action="store_true")
    ap.add_argument("--offline", type=int, default=64, help="prompts for the offline batch job (0: skip)")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.model is None:
        from qwenc.formats.demo import demo_model_path
        args.model = str(demo_model_path())
    from qwenc.text.tokenizer import Tokenizer
    from qwenc.formats.gguf import open_gguf
    tok = Tokenizer.from_gguf_metadata(open_gguf(args.model).metadata)

    def count_tokens(text):
        return len(tok.encode(text, allow_special=False)) if text else 0
    long_prompt = " ".join(prompt_for(i) for i in range(3))
    long_prompt = tok.decode(tok.encode(long_prompt)[:200])
    peers = [p for p in args.peers.split(",") if p]
    if args.llama_server:
        peers.append("llama-server")
    levels = [int(c) for c in args.concurrency.split(",")]
    runs = {p: {c: [] for c in levels} for p in peers}
    loaded = {p: [] for p in peers}
    print(f"model {args.model}\nthreads {args.threads}, gen {args.gen}, {args.per_client} requests per client, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    for rep in range(args.repeats):
        order = peers if rep % 2 == 0 else peers[::-1]
        for peer in order:
            srv = start(peer, args.model, args.threads, args.llama_server, args.max_batch)
            try:
                stream_completion(srv.url, prompt_for(999), 8, [])  # warm-up
                for c in levels:
                    r = run_level(srv.url, c, args.per_client, args.gen, count_tokens, base=1000 * c + rep)
                    runs[peer][c].append(r)
                    print(f"  [{rep}] {peer:17s} C={c:2d}  {r['aggregate_tok_s']:7.1f} tok/s  "
                          f"TTFT p50 {r['ttft_p50']:.2f}s  ITL p50 {1000 * r['itl_p50']:.0f}ms  failed {r['failed']}/{r['requests']}",
                          flush=True)
                if not args.no_ttft_load:
                    loaded[peer].extend(ttft_under_load(srv.url, count_tokens, long_prompt, tries=1 if rep else 2))
            finally:
                srv.stop()
    med = {p: {c: {k: statistics.median(r[k] for r in runs[p][c]) for k in runs[p][c][0]} for c in levels}
           for p in peers}
    print("\n| server | streams | aggregate tok/s | vs 1 stream | TTFT p50 / p99 s | ITL p50 / p99 ms | failed requests |")
    print("|---|---|---|---|---|---|---|")
    for p in peers:
        one = med[p][levels[0]]["aggregate_tok_s"]
        for c in levels:
            m = med[p][c]
            print(f"| {p} | {c} | {m['aggregate_tok_s']:.1f} | {m['aggregate_tok_s'] / one:.2f}x | "
                  f"{m['ttft_p50']:.2f} / {m['ttft_p99']:.2f} | {1000 * m['itl_p50']:.0f} / {1000 * m['itl_p99']:.0f} | "
                  f"{m['failed']:.0f} of {m['requests']:.0f} |")
    if not args.no_ttft_load:
        print("\nTTFT of a 200-token prompt beside 8 decoding streams (s): " +
              ", ".join(f"{p} {statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]" for p, v in loaded.items() if v))
    result = {"median": med, "runs": runs, "ttft_under_load": loaded}
    if args.offline:
        o = offline(args.model, args.threads, args.offline, args.gen)
        print(f"\noffline job: {o['prompts']} prompts x {args.gen} tokens: one by one {o['one_by_one_s']:.1f} s, "
              f"Engine.generate {o['engine_s']:.1f} s = {o['speedup']:.2f}x; identical {o['identical']}/{o['prompts']}")
        result["offline"] = o
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
