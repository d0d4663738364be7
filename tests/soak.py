"""Soak: `qwenc serve` under bounded mixed load on loopback, with hostile requests mixed in.

    python tests/soak.py [--model GGUF] [--duration 300] [--clients 16] [--seed 0]

Starts the server as its own process (so a crash shows as an exit and its resident memory can
be read), then C client threads send requests until the deadline: chat and completions,
streamed or not, with mixed sampling settings (greedy, seeded, top-p/top-k, penalties, stop
strings, logprobs, n=2), some streams dropped at a random point, and about one request in
twelve hostile (malformed JSON, wrong types, limits exceeded, invalid UTF-8, deep nesting, an
oversize body, an unknown model, a prompt beyond the context). What must hold at the end:

  - no 5xx answer and no failed connection, ever; hostile requests answered 4xx;
  - the server process still alive; its own (anonymous) resident memory flat after warm-up (the
    growth is reported; mapped weight pages are counted apart);
  - once idle, every KV block back in the pool and no request running or waiting (/metrics).

Exit status 0 when all holds. tests/test_soak.py runs a 30-second version; `make soak` five
minutes.
"""
import argparse
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent

WORDS = ("river stone lamp code graph kernel cache token prime orbit garden signal vector thread "
         "window market forest engine").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid, kind="RssAnon") -> int:
    """Resident memory of a process: RssAnon (its own allocations: what a leak grows) or RssFile
    (pages of mapped files: the weights, faulted in as they are first read)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(kind + ":"):
                return int(line.split()[1]) * 1024
    return 0


def metrics(url) -> dict:
    out = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


def sentence(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def sampling(rng) -> dict:
    kind = rng.randrange(5)
    if kind == 0:
        return {"temperature": 0}
    if kind == 1:
        return {"temperature": rng.choice([0.5, 0.8, 1.0]), "seed": rng.randrange(1000)}
    if kind == 2:
        return {"temperature": 0.9, "top_p": rng.choice([0.5, 0.9]), "top_k": rng.choice([0, 10, 40])}
    if kind == 3:
        return {"temperature": 0.7, "presence_penalty": 0.5, "frequency_penalty": 0.3, "repetition_penalty": 1.1}
    return {"temperature": 0.6, "min_p": 0.05, "stop": [rng.choice(WORDS), "\n\n"]}


def hostile(rng, url):
    """(method, path, kwargs for httpx) of one hostile request."""
    chat = url + "/v1/chat/completions"
    kind = rng.randrange(11)
    if kind == 0:
        return chat, {"content": b'{"messages": [', "headers": {"content-type": "application/json"}}
    if kind == 1:
        return chat, {"json": {"messages": "not a list", "max_tokens": "many"}}
    if kind == 2:
        return chat, {"json": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10 ** 9}}
    if kind == 3:
        return chat, {"json": {"messages": [{"role": "user", "content": "hi"}], "n": 1000}}
    if kind == 4:
        return chat, {"content": b'{"messages": [{"role": "user", "content": "\xff\xfe\xfd"}]}',
                      "headers": {"content-type": "application/json"}}
    if kind == 5:
        return chat, {"content": b"[" * 50000 + b"]" * 50000}
    if kind == 6:
        return chat, {"content": b'{"messages": [{"role": "user", "content": "' + b"x" * (9 << 20) + b'"}]}'}
    if kind == 7:
        return chat, {"json": {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}}
    if kind == 8:
        return chat, {"json": {"messages": [{"role": "user", "content": "word " * 6000}], "max_tokens": 4}}
    if kind == 9:
        return url + "/v1/completions", {"json": {"prompt": "hi", "top_logprobs": 50, "logprobs": 99}}
    return chat, {"json": {"messages": [{"role": "user", "content": "a"}] * 5000, "max_tokens": 2,
                           "temperature": -3}}


class Soak:
    def __init__(self, url, duration, clients, seed):
        self.url, self.duration, self.clients, self.seed = url, duration, clients, seed
        self.lock = threading.Lock()
        self.counts = Counter()
        self.failures = []

    def record(self, kind, status, detail=""):
        with self.lock:
            self.counts[(kind, status)] += 1
            if status == "error" or (isinstance(status, int) and status >= 500):
                self.failures.append(f"{kind}: {status} {detail}"[:500])

    def one(self, rng, client):
        if rng.random() < 1 / 12:
            path, kwargs = hostile(rng, self.url)
            try:
                r = client.post(path, **kwargs)
                ok = 400 <= r.status_code < 500
                self.record("hostile", r.status_code, "" if ok else r.text)
                if not ok:
                    with self.lock:
                        self.failures.append(f"hostile request answered {r.status_code}: {r.text[:200]}")
            except httpx.HTTPError as exc:
                self.record("hostile", "error", repr(exc))
            return
        chat = rng.random() < 0.6
        stream = rng.random() < 0.6
        body = {**sampling(rng), "max_tokens": rng.randrange(4, 48), "stream": stream}
        if rng.random() < 0.15:
            body["n"] = 2
        if chat:
            msgs = [{"role": "user", "content": sentence(rng, rng.randrange(3, 60))}]
            if rng.random() < 0.3:
                msgs.insert(0, {"role": "system", "content": "You answer briefly. " * 10})
            body["messages"] = msgs
            if rng.random() < 0.2:
                body.update(logprobs=True, top_logprobs=2)
            path = self.url + "/v1/chat/completions"
        else:
            body["prompt"] = sentence(rng, rng.randrange(3, 80))
            if rng.random() < 0.2:
                body["logprobs"] = 2
            path = self.url + "/v1/completions"
        kind = ("chat" if chat else "completion") + ("-stream" if stream else "")
        try:
            if not stream:
                r = client.post(path, json=body)
                self.record(kind, r.status_code, r.text[:200])
                if r.status_code == 200:
                    json.loads(r.text)
                return
            drop_after = rng.randrange(1, 12) if rng.random() < 0.3 else None
            with client.stream("POST", path, json=body) as r:
                if r.status_code != 200:
                    r.read()
                    self.record(kind, r.status_code, r.text[:200])
                    return
                lines = 0
                done = False
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        done = True
                        break
                    if line.startswith("data: "):
                        payload = json.loads(line[6:])
                        if "error" in payload:
                            self.record(kind, "error", json.dumps(payload)[:200])
                            return
                        lines += 1
                        if drop_after is not None and lines >= drop_after:
                            self.record(kind + "-dropped", 200)
                            return  # leaving the block closes the connection mid-stream
                self.record(kind, 200 if done else "error", "" if done else "stream ended without [DONE]")
        except httpx.HTTPError as exc:
            self.record(kind, "error", repr(exc))

    def run(self):
        deadline = time.monotonic() + self.duration

        def worker(k):
            rng = random.Random(self.seed * 1000 + k)
            with httpx.Client(timeout=600) as client:
                while time.monotonic() < deadline:
                    self.one(rng, client)
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(self.clients)]
        for t in threads:
            t.start()
        return threads


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--duration", type=float, default=300)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-rss-growth-mb", type=float, default=64)
    args = ap.parse_args(argv)
    if args.model is None:
        sys.path.insert(0, str(REPO))
        from qwenc.formats.demo import demo_model_path
        args.model = str(demo_model_path())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "qwenc", "serve", "-m", args.model, "--port", str(port),
                             "--max-batch", "16", "--kv-memory", "512MiB", "--context", "4096", "-q"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                print(proc.stderr.read().decode()[-3000:])
                return 1
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                print("server did not start")
                return 1
            time.sleep(0.3)
        rss_start = rss_bytes(proc.pid)
        soak = Soak(url, args.duration, args.clients, args.seed)
        t0 = time.monotonic()
        threads = soak.run()
        samples = []
        while any(t.is_alive() for t in threads):
            samples.append((time.monotonic() - t0, rss_bytes(proc.pid)))
            if proc.poll() is not None:
                soak.failures.append(f"the server exited with {proc.returncode}")
                break
            time.sleep(1.0)
        for t in threads:
            t.join(180)
        alive = proc.poll() is None
        # idle: every block back, nothing running or waiting
        idle, m = False, {}
        end = time.monotonic() + 60
        while alive and time.monotonic() < end:
            m = metrics(url)
            if m.get('qwenc_kv_blocks{state="used"}') == 0 and m.get("qwenc_requests_running") == 0 \
                    and m.get("qwenc_requests_waiting") == 0:
                idle = True
                break
            time.sleep(0.2)
        warm = [r for t, r in samples if t >= 0.2 * args.duration] or [r for _, r in samples]
        growth = (samples[-1][1] - warm[0]) / 2 ** 20 if samples else 0.0
        by_kind = Counter()
        for (kind, status), n in soak.counts.items():
            by_kind[kind] += n
        fivexx = sum(n for (k, s), n in soak.counts.items() if isinstance(s, int) and s >= 500)
        errors = sum(n for (k, s), n in soak.counts.items() if s == "error")
        print(f"soak: {args.duration:.0f} s, {args.clients} clients, {sum(soak.counts.values())} requests")
        for kind in sorted(by_kind):
            statuses = {s: n for (k, s), n in soak.counts.items() if k == kind}
            print(f"  {kind:24s} {by_kind[kind]:6d}  {statuses}")
        print(f"  5xx {fivexx}, failed connections/streams {errors}, server alive {alive}")
        print(f"  anonymous RSS: start {rss_start / 2 ** 20:.0f} MiB, after warm-up {warm[0] / 2 ** 20:.0f} MiB, "
              f"end {samples[-1][1] / 2 ** 20 if samples else 0:.0f} MiB (growth after warm-up {growth:+.1f} MiB); "
              f"file-backed (the mapped weights) {rss_bytes(proc.pid, 'RssFile') / 2 ** 20:.0f} MiB")
        used, cached = m.get('qwenc_kv_blocks{state="used"}'), m.get('qwenc_kv_blocks{state="cached"}')
        print(f"  idle: KV blocks used {used}, running {m.get('qwenc_requests_running')}, waiting "
              f"{m.get('qwenc_requests_waiting')}, cached blocks {cached}")
        for f in soak.failures[:20]:
            print("  FAIL", f)
        ok = alive and idle and fivexx == 0 and errors == 0 and not soak.failures and \
            growth <= args.max_rss_growth_mb and by_kind.get("hostile", 0) > 0
        print("soak:", "PASS" if ok else "FAIL")
        return 0 if ok else 1
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    sys.exit(main())
