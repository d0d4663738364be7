"""A live `qwenc serve` for tests: uvicorn on 127.0.0.1 (a free port) in a background thread,
over an Engine the test also holds (so tests can look at its block pool)."""
import re
import threading
import time

import httpx

from qwenc.engine.engine import Engine
from qwenc.server import make_server


class LiveServer:
    def __init__(self, model, api_key=None, model_name="test-model", **engine_kwargs):
        engine_kwargs.setdefault("max_batch", 16)
        engine_kwargs.setdefault("kv_memory", "128MiB")
        self.engine = Engine(model, **engine_kwargs)
        self.model_name = model_name
        addr = {}
        self.server = make_server(self.engine, port=0, model_name=model_name, api_key=api_key,
                                  log_level="error", grace=5, ready=lambda a: addr.update(a=a))
        self.thread = threading.Thread(target=self.server.run, name="test-server", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while "a" not in addr:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("test server did not start")
            time.sleep(0.02)
        host, port = addr["a"]
        self.url = f"http://{host}:{port}"
        self.api_key = api_key

    def client(self, **kwargs):
        from openai import OpenAI
        kwargs.setdefault("api_key", self.api_key or "none")
        return OpenAI(base_url=self.url + "/v1", max_retries=0, timeout=120, **kwargs)

    def metrics(self) -> dict:
        """/metrics as {name{labels}: value}."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                m = re.match(r"^(\S+)\s+(\S+)$", line)
                if m:
                    out[m.group(1)] = float(m.group(2))
        return out

    def wait_idle(self, timeout=10.0):
        """Until no KV block is held (every request's blocks are back), per /metrics."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if m.get('qwenc_kv_blocks{state="used"}') == 0 and m.get("qwenc_requests_running") == 0:
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"blocks still held after {timeout} s: {m}")
            time.sleep(0.05)

    def close(self):
        self.server.should_exit = True
        self.thread.join(15)
        self.engine.shutdown(grace=0)
