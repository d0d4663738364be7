"""Prometheus metrics of one server: the engine's queues, tokens and KV blocks, latencies, HTTP.

Gauges and totals are read from the engine when /metrics is scraped (a collector over its
counters, so nothing is double-booked); latencies and step sizes are observed as they happen,
from the engine's thread, into histograms. Each app has its own registry, so several servers
(or tests) in one process do not mix their numbers.
"""
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0,
                   5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


class _EngineCollector:
    def __init__(self, engine):
        self.engine = engine

    def collect(self):
        e = self.engine
        snap, st = e.snapshot(), e.stats
        g = GaugeMetricFamily("qwenc_requests_running", "Requests holding KV blocks and being computed")
        g.add_metric([], snap["running"])
        yield g
        g = GaugeMetricFamily("qwenc_requests_waiting", "Requests queued, not yet admitted")
        g.add_metric([], snap["waiting"])
        yield g
        g = GaugeMetricFamily("qwenc_kv_blocks", "KV cache blocks by state (cached: findable by prefix hash, "
                                                 "held or not)", labels=["state"])
        g.add_metric(["total"], snap["kv_blocks_total"])
        g.add_metric(["used"], snap["kv_blocks_used"])
        g.add_metric(["free"], snap["kv_blocks_free"])
        g.add_metric(["cached"], snap["kv_blocks_cached"])
        yield g
        g = GaugeMetricFamily("qwenc_kv_block_tokens", "Token positions per KV block")
        g.add_metric([], e.pool.block_size)
        yield g
        c = CounterMetricFamily("qwenc_prompt_tokens", "Prompt tokens of finished requests")
        c.add_metric([], st.prompt_tokens)
        yield c
        c = CounterMetricFamily("qwenc_cached_prompt_tokens", "Prompt tokens found in the prefix cache")
        c.add_metric([], st.cached_tokens)
        yield c
        c = CounterMetricFamily("qwenc_generation_tokens", "Tokens generated")
        c.add_metric([], st.generated)
        yield c
        c = CounterMetricFamily("qwenc_requests_finished", "Finished requests by reason", labels=["reason"])
        for reason, n in sorted(st.finished.items()):
            c.add_metric([reason], n)
        yield c
        c = CounterMetricFamily("qwenc_requests_failed", "Requests that failed inside the engine")
        c.add_metric([], st.failed)
        yield c
        c = CounterMetricFamily("qwenc_preemptions", "Requests preempted for lack of KV blocks")
        c.add_metric([], snap["preemptions"])
        yield c
        c = CounterMetricFamily("qwenc_steps", "Forward steps run")
        c.add_metric([], st.steps)
        yield c


class Metrics:
    def __init__(self, engine):
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine))
        r = self.registry
        self.ttft = Histogram("qwenc_time_to_first_token_seconds", "Submission to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("qwenc_inter_token_latency_seconds", "Time between a request's tokens",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.batch = Histogram("qwenc_step_batch_size", "Requests computed per step", buckets=BATCH_BUCKETS,
                               registry=r)
        self.step_tokens = Histogram("qwenc_step_tokens", "Tokens computed per step", buckets=TOKEN_BUCKETS,
                                     registry=r)
        self.step_seconds = Histogram("qwenc_step_seconds", "Duration of a forward step",
                                      buckets=LATENCY_BUCKETS, registry=r)
        self.http = Counter("qwenc_http_requests", "HTTP requests by route and status", ["route", "status"],
                            registry=r)
        engine.stats.listeners.append(self.observe)

    def observe(self, name, value):
        if name == "ttft":
            self.ttft.observe(value)
        elif name == "itl":
            self.itl.observe(value)
        elif name == "step":
            rows, tokens, seconds = value
            self.batch.observe(rows)
            self.step_tokens.observe(tokens)
            self.step_seconds.observe(seconds)
