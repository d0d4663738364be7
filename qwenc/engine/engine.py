"""The batching engine: many requests, one model, one loop.

    engine = qwenc.Engine(model, max_batch=16, kv_memory="1GiB")
    for out in engine.submit("def fib(n):", max_tokens=64):     # a thread-safe stream
        print(out.text, end="")
    async for out in engine.submit(messages, max_tokens=64):    # the same, from asyncio
        ...
    results = engine.generate(list_of_prompts, max_tokens=64)   # an offline job, batched

A single thread (the loop) owns the model. `submit` validates a request in the caller's thread
(bad settings and prompts too long fail there, at once), then hands it over. Each turn of the
loop takes in new requests and cancellations, asks the scheduler for a step (every running
sequence's next token plus chunks of waiting prompts, within a token budget), runs it as one
forward pass, samples the rows that produce a token, detokenizes, checks stop rules and pushes
the new pieces to each request's stream. Finished and cancelled requests leave between steps and
their KV blocks go back to the pool at once.

Results never depend on the batch: every row of a step is computed on its own, so a request
gives the same tokens (at temperature 0, or with a seed) alone or beside others.
"""
import asyncio
import collections
import itertools
import re
import threading
import time
import uuid
from dataclasses import dataclass, field

import numpy as np

from ..errors import ContextLengthExceeded, EngineStopped, InvalidRequest, QueueFull, QwencError
from ..model import BLOCK_SIZE, KVCache, Sequence, StepItem
from ..text.textstream import TextStream
from .generate import render_chat
from .kv_pool import BlockPool, block_hashes
from .sampling import OPENAI_FIELDS, SAMPLING_FIELDS, Sampler, SamplingParams, TokenLogprob, top_logprobs_count
from .sampling import logprobs as row_logprobs
from .scheduler import Scheduler

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)B?\s*$", re.IGNORECASE)


def parse_size(size) -> int:
    """Bytes in "1GiB", "512MB", "2G", "300000000" or an int."""
    if isinstance(size, bool):
        raise InvalidRequest(f"not a memory size: {size!r}")
    if isinstance(size, (int, float)):
        value = int(size)
    else:
        m = _SIZE.match(str(size))
        if not m:
            raise InvalidRequest(f"not a memory size: {size!r} (e.g. 1GiB, 512MiB, 2G)")
        base = 1024 if (m.group(3) or m.group(2).upper() in "KMGT" and m.group(2)) else 1
        power = " KMGT".index(m.group(2).upper() or " ")
        value = int(float(m.group(1)) * base ** power)
    if value <= 0:
        raise InvalidRequest(f"memory size must be positive, got {size!r}")
    return value


# ---------------------------------------------------------------- what a request gets back

@dataclass
class Output:
    """What one step produced for a request. `text` is the newly released text (complete UTF-8,
    never part of a stop string; may be empty while text is held back); `token_ids` the tokens
    sampled; the last Output has `finish_reason` ("stop", "length", "cancelled") and the
    counts."""
    request_id: str
    text: str = ""
    token_ids: list = field(default_factory=list)
    logprobs: list = None            # [TokenLogprob] for token_ids, when asked for
    finish_reason: str = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    prompt_logprobs: list = None     # on the first Output, when asked: a TokenLogprob per prompt
                                     # token, the first one's logprob None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class Completion:
    """A finished request: the whole text and tokens, why it ended, and the counts."""
    request_id: str
    text: str
    token_ids: list
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    logprobs: list = None
    prompt_logprobs: list = None
    prompt_ids: list = None

    @property
    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


class RequestStream:
    """A request's outputs, as they come: iterate it (`for out in stream`, from any thread) or
    `async for out in stream`. Leaving the loop early (break, an exception, a client gone)
    cancels the request and frees its KV blocks; `cancel()` does it explicitly; `result()` /
    `await aresult()` wait for the end and return the Completion."""

    def __init__(self, engine, request_id: str, prompt_ids):
        self._engine = engine
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self._items = collections.deque()
        self._cond = threading.Condition()
        self._waker = None      # (loop, asyncio.Event) of an async consumer
        self._done = False
        self._consumed = False

    # -- producer side (the engine loop) -----------------------------------------------------

    def _put(self, item):
        with self._cond:
            self._items.append(item)
            if isinstance(item, BaseException) or item.finished:
                self._done = True
            self._cond.notify_all()
            waker = self._waker
        if waker is not None:
            loop, event = waker
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the consumer's loop is closed: nobody is listening
                pass

    # -- consumer side -----------------------------------------------------------------------

    def _take(self, timeout=None):
        with self._cond:
            while not self._items:
                if not self._cond.wait(timeout):
                    raise TimeoutError(f"no output from request {self.request_id} within {timeout} s")
            item = self._items.popleft()
        if isinstance(item, BaseException):
            raise item
        return item

    def __iter__(self):
        return self._iterate()

    def __aiter__(self):
        return self._aiterate()

    async def _atake(self):
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                if self._items:
                    item = self._items.popleft()
                    break
                if self._waker is None or self._waker[0] is not loop:
                    self._waker = (loop, asyncio.Event())
                event = self._waker[1]
                event.clear()
            await event.wait()
        if isinstance(item, BaseException):
            raise item
        return item

    async def _aiterate(self):
        finished = False
        try:
            while True:
                out = await self._atake()
                yield out
                if out.finished:
                    finished = True
                    return
        finally:
            if not finished:
                self.cancel()

    def cancel(self):
        """Stop the request (a no-op once it has finished)."""
        if not self._done:
            self._engine._cancel(self.request_id)

    def result(self, timeout=None) -> Completion:
        return self._collect(self._iterate(timeout))

    def _iterate(self, timeout=None):
        """Outputs until the last; leaving early cancels. `timeout` bounds the whole wait."""
        deadline = None if timeout is None else time.monotonic() + timeout
        finished = False
        try:
            while True:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                out = self._take(left)
                yield out
                if out.finished:
                    finished = True
                    return
        finally:
            if not finished:
                self.cancel()

    async def aresult(self) -> Completion:
        outs = [out async for out in self]
        return self._collect(outs)

    def _collect(self, outs) -> Completion:
        text, ids, lps, plp, last = [], [], [], None, None
        for out in outs:
            text.append(out.text)
            ids.extend(out.token_ids)
            if out.logprobs:
                lps.extend(out.logprobs)
            if out.prompt_logprobs is not None:
                plp = out.prompt_logprobs
            last = out
        return Completion(self.request_id, "".join(text), ids, last.finish_reason, last.prompt_tokens,
                          last.completion_tokens, last.cached_tokens, lps or None, plp, self.prompt_ids)


# ---------------------------------------------------------------- a request inside the engine

class _Request:
    def __init__(self, rid, prompt_ids, params, sampler, stream_text, max_tokens, stops, logprobs,
                 top_logprobs, prompt_logprobs, cache, capacity, out, arrival):
        self.id = rid
        self.tokens = list(prompt_ids)       # the prompt, then every generated token
        self.num_prompt = len(prompt_ids)
        self.num_computed = 0                # leading tokens whose KV is in the cache
        self.blocks = []
        self.hashes = block_hashes(prompt_ids, BLOCK_SIZE)
        self.n_registered = 0
        self.cached_tokens = None
        self.params = params
        self.sampler = sampler
        self.text = stream_text              # TextStream: detokenization and stop strings
        self.max_tokens = max_tokens
        self.stop_ids = stops
        self.logprobs = logprobs
        self.top_logprobs = top_logprobs
        self.prompt_logprobs = prompt_logprobs
        self.capacity = capacity
        self.seq = Sequence(cache, np.zeros(0, np.int32), capacity)
        self.out = out                       # its RequestStream
        self.arrival = arrival
        self.first_token_at = None
        self.last_token_at = None
        self.sent_prompt_logprobs = False
        self.prompt_lp = [TokenLogprob(self.tokens[0], None, [])] if prompt_logprobs else None
        self.matcher = None                  # the grammar's state, for a constrained request
        self.raw_logits = None               # this step's logits before masks, when logprobs are asked

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.num_prompt

    def on_preempt(self):
        self.num_computed = 0
        self.n_registered = 0
        self.seq.tokens = []

    def sync_sequence(self):
        """Point the forward pass's Sequence at this request's blocks and computed tokens."""
        # rebuilt every step: after a preemption the table may hold as many blocks as before,
        # but other ones
        self.seq.block_table = np.asarray(self.blocks, dtype=np.int32)
        if len(self.seq.tokens) != self.num_computed:
            self.seq.tokens = self.tokens[:self.num_computed]


# ---------------------------------------------------------------- the engine

class Engine:
    """Continuous batching over one Model (see the module docstring).

    max_batch:        most requests running (holding KV) at once
    kv_memory:        the KV cache's size ("1GiB", bytes, ...), split into 16-token blocks
    max_step_tokens:  the token budget of one step (decode rows + prompt chunks)
    max_queue:        most requests waiting; submit raises QueueFull beyond it
    context:          most tokens per request, prompt included (default: the model's context)
    start:            start the loop now (False: call start() later, e.g. to queue a whole batch
                      first so that the first step sees it all)
    """

    def __init__(self, model, max_batch: int = 16, kv_memory="1GiB", max_step_tokens: int = 256,
                 max_queue: int = 1024, context: int = None, start: bool = True):
        for name, v in (("max_batch", max_batch), ("max_step_tokens", max_step_tokens), ("max_queue", max_queue)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidRequest(f"{name} must be a positive integer, got {v!r}")
        self.model = model
        cfg = model.config
        self.context = int(context or model.context)
        if self.context < 2:
            raise InvalidRequest(f"context must be at least 2 tokens, got {self.context}")
        kv_dtype = model.transformer.kv_dtype
        block_bytes = KVCache.block_bytes(cfg, dtype=kv_dtype)
        num_blocks = parse_size(kv_memory) // block_bytes
        if num_blocks < 2:
            raise InvalidRequest(f"kv_memory={kv_memory!r} holds fewer than 2 blocks of {block_bytes} bytes")
        self.cache = KVCache(cfg, num_blocks, prefault=True, dtype=kv_dtype)
        self.pool = BlockPool(num_blocks, BLOCK_SIZE)
        self.scheduler = Scheduler(self.pool, max_batch, max_step_tokens)
        self.max_queue = max_queue
        self.max_tokens_per_request = min(self.context, num_blocks * BLOCK_SIZE)
        self.stats = EngineStats()
        self._requests = {}
        self._inbox = collections.deque()
        self._cancels = collections.deque()
        self._cv = threading.Condition()
        self._accepting = True
        self._stop = False
        self._deadline = None          # shutdown grace: running requests end by then
        self._arrivals = itertools.count()
        self._error = None
        self._masker = None            # the worker computing grammar masks during a step
        self._thread = threading.Thread(target=self._loop, name="qwenc-engine", daemon=True)
        if start:
            self._thread.start()

    def start(self):
        if not self._thread.is_alive() and self._thread.ident is None:
            self._thread.start()

    # -- submitting --------------------------------------------------------------------------

    def submit(self, prompt, max_tokens: int = None, stop=None, stop_token_ids=None, ignore_eos=False,
               logprobs: bool = False, top_logprobs: int = 0, prompt_logprobs: bool = False,
               skip_special_tokens: bool = True, tools=None, chat_template_kwargs=None,
               constraint=None, thinking: str = None, request_id: str = None, suffix=None,
               **sampling) -> RequestStream:
        """Queue a request; returns its stream at once.

        prompt: text (completed as is), a list of token ids, or a list of chat messages (rendered
        with the model's chat template, with `tools` and `chat_template_kwargs`).
        max_tokens: most tokens to generate (default: what the context leaves after the prompt).
        stop: a string or strings that end the text (not included); stop_token_ids end it too,
        beside the model's EOS ids (unless ignore_eos). sampling: temperature, top_k, top_p,
        min_p, repetition_penalty, presence_penalty, frequency_penalty, logit_bias, seed; unset
        ones come from the model's generation_config.json.
        suffix: text (or ids) after the gap: the prompt (text or ids) is then the code before it,
        and the model writes what goes between (fill in the middle, Qwen2.5-Coder's format).
        constraint: what the output must match (a spec of qwenc.engine.constraints: json_object,
        json_schema, regex, grammar, a pydantic class, or a compiled Grammar), compiled here; EOS
        is allowed exactly when the grammar accepts. thinking: the phase a chat reply starts in
        (constraints.thinking_phase), so that the grammar applies after Qwen3's <think> part.
        Raises InvalidRequest (bad settings), ContextLengthExceeded (the prompt plus max_tokens
        cannot fit), QueueFull, EngineStopped.
        """
        model = self.model
        fim_ends = []
        if suffix is not None:
            if _is_messages(prompt):
                raise InvalidRequest("a suffix goes with a text (or token ids) prompt, not chat messages")
            prompt, fim_ends = model.tokenizer_or_raise().fill_in_middle(
                prompt.tolist() if isinstance(prompt, np.ndarray) else prompt, suffix)
        prompt_ids = self.prompt_ids(prompt, tools=tools, chat_template_kwargs=chat_template_kwargs)
        params = self.sampling_params(**sampling)
        n = len(prompt_ids)
        limit = self.max_tokens_per_request
        if max_tokens is None:
            max_tokens = limit - n
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise InvalidRequest(f"max_tokens must be an integer >= 0, got {max_tokens!r}")
        if n + max_tokens > limit or n >= limit:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{n + max_tokens} tokens ({n} in the prompt, {max_tokens} in the completion). "
                f"Please reduce the length of the prompt or the completion.")
        top_logprobs = top_logprobs_count(top_logprobs)
        stop = [stop] if isinstance(stop, str) else list(stop or [])
        if any(not isinstance(s, str) or not s for s in stop):
            raise InvalidRequest("stop must be a non-empty string or a list of them")
        stops = set() if ignore_eos else set(model.eos_token_ids) | set(fim_ends)
        for t in stop_token_ids or ():
            if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                raise InvalidRequest(f"stop_token_ids must be token ids, got {t!r}")
            stops.add(t)
        tok = model.tokenizer_or_raise()
        matcher = self._matcher(constraint, thinking)
        sampler = Sampler(params, model.n_vocab, history=prompt_ids)
        rid = request_id or "req-" + uuid.uuid4().hex[:20]
        stream = RequestStream(self, rid, prompt_ids)
        req = _Request(rid, prompt_ids, params, sampler, TextStream(tok, stop, skip_special_tokens), max_tokens,
                       stops, bool(logprobs), top_logprobs, bool(prompt_logprobs), self.cache, self.context,
                       stream, next(self._arrivals))
        req.submitted_at = time.perf_counter()
        req.matcher = matcher
        with self._cv:
            if not self._accepting:
                raise EngineStopped("the engine is shutting down")
            if self._error is not None:
                raise EngineStopped(f"the engine failed: {self._error}")
            if len(self._inbox) + len(self.scheduler.waiting) >= self.max_queue:
                raise QueueFull(f"{self.max_queue} requests are already waiting")
            self._inbox.append(req)
            self.stats.submitted += 1
            self._cv.notify()
        return stream

    def _matcher(self, constraint, thinking):
        if constraint is None:
            return None
        from .constraints import Grammar, ThinkingGate, compile_constraint, tokenizer_info
        grammar = constraint if isinstance(constraint, Grammar) else \
            compile_constraint(tokenizer_info(self.model), constraint)
        if grammar is None:
            return None
        matcher = grammar.matcher()
        if thinking not in (None, "answer") and matcher.info.token_id("</think>") is not None:
            return ThinkingGate(matcher, thinking)
        return matcher

    def prompt_ids(self, prompt, tools=None, chat_template_kwargs=None) -> list:
        """Token ids of a prompt given as text, ids or chat messages."""
        model = self.model
        if isinstance(prompt, str):
            ids = model.tokenizer_or_raise().encode(prompt)
        elif _is_messages(prompt):
            ids = model.tokenizer_or_raise().encode(render_chat(model, prompt, True, tools,
                                                                **(chat_template_kwargs or {})))
        elif isinstance(prompt, (list, tuple, np.ndarray)):
            ids = []
            for t in prompt:
                if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
                    raise InvalidRequest("a prompt must be text, token ids or chat messages")
                ids.append(int(t))
        else:
            raise InvalidRequest(f"a prompt must be text, token ids or chat messages, got {type(prompt).__name__}")
        if not ids:
            raise InvalidRequest("the prompt is empty")
        vocab = model.config.vocab_size
        arr = np.asarray(ids, dtype=np.int64)
        outside = (arr < 0) | (arr >= vocab)
        if outside.any():
            raise InvalidRequest(f"token id {arr[outside.argmax()]} outside the vocabulary (0..{vocab - 1})")
        if model.tokenizer is not None:  # the model's padded embedding rows are no tokens: no text to echo
            bad = model.tokenizer.first_non_token(arr)
            if bad is not None:
                raise InvalidRequest(f"token id {bad} is not a token of this model's vocabulary "
                                     f"({model.tokenizer.vocab_size} tokens)")
        return ids

    def sampling_params(self, **sampling) -> SamplingParams:
        unknown = set(sampling) - set(SAMPLING_FIELDS) - set(OPENAI_FIELDS)
        if unknown:
            raise InvalidRequest(f"unknown sampling setting(s): {', '.join(sorted(unknown))}")
        try:
            return self.model.sampling_params(**sampling)
        except QwencError:
            raise
        except ValueError as exc:  # a setting out of range: the caller's fault
            raise InvalidRequest(str(exc)) from None

    def generate(self, prompts, **kwargs) -> list:
        """Run a whole offline job batched: one Completion per prompt, in order."""
        streams = [self.submit(p, **kwargs) for p in prompts]
        return [s.result() for s in streams]

    # -- stopping ----------------------------------------------------------------------------

    def shutdown(self, grace: float = None, wait: bool = True):
        """Stop taking requests; let running ones finish (within `grace` seconds, after which
        they end with finish_reason "length"; None waits for all), then stop the loop."""
        with self._cv:
            self._accepting = False
            self._deadline = None if grace is None else time.monotonic() + grace
            self._stop = True
            self._cv.notify()
        if self._thread.ident is None:  # never started: run the loop so queued requests end
            self._thread.start()
        if wait and threading.current_thread() is not self._thread:
            self._thread.join()

    close = shutdown

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown(grace=0)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _cancel(self, rid):
        with self._cv:
            self._cancels.append(rid)
            self._cv.notify()

    # -- the loop ----------------------------------------------------------------------------

    def _loop(self):
        try:
            while True:
                with self._cv:
                    while not (self._inbox or self._cancels or self.scheduler.has_work() or self._stop):
                        self._cv.wait()
                    inbox, self._inbox = list(self._inbox), collections.deque()
                    cancels, self._cancels = list(self._cancels), collections.deque()
                    stopping, deadline = self._stop, self._deadline
                for req in inbox:
                    self._requests[req.id] = req
                    self.scheduler.add(req)
                for rid in cancels:
                    req = self._requests.get(rid)
                    if req is not None:
                        self._finish(req, "cancelled")
                if stopping:
                    for req in list(self.scheduler.waiting):  # never started: nothing to finish
                        self._finish(req, "cancelled")
                    if deadline is not None and time.monotonic() >= deadline:
                        for req in list(self.scheduler.running):
                            self._finish(req, "length")
                    if not self.scheduler.has_work():
                        return
                if self.scheduler.has_work():
                    self._step()
        except BaseException as exc:  # a bug: fail every request rather than hang them
            self._error = exc
            for req in list(self._requests.values()):
                req.out._put(EngineStopped(f"the engine failed: {exc!r}"))
            self._requests.clear()
            raise
        finally:
            if self._masker is not None:
                self._masker.shutdown(wait=False)

    def _step(self):
        plan = self.scheduler.schedule()
        if not plan:
            # nothing fits now (cannot happen with the submit checks); do not spin
            with self._cv:
                self._cv.wait(0.01)
            return
        items = []
        for c in plan:
            c.req.sync_sequence()
            want = "all" if c.req.prompt_logprobs and c.start < c.req.num_prompt else \
                ("last" if c.wants_logits else "none")
            items.append(StepItem(c.req.seq, c.req.tokens[c.start:c.start + c.n], want))
        # The grammar masks of the rows that sample this step depend only on tokens already
        # accepted, so they are computed in a worker while the forward pass runs (both release
        # the GIL): their cost hides behind the step instead of adding to it.
        constrained = [c.req for c in plan if c.req.matcher is not None and c.start + c.n == len(c.req.tokens)]
        masks = self._mask_pool().submit(self._fill, constrained) if constrained else None
        t0 = time.perf_counter()
        try:
            logits = self.model.step(items)
        except Exception as exc:  # e.g. out of memory: these requests fail, the engine goes on
            if masks is not None:
                masks.exception()
            for c in plan:
                self._fail(c.req, exc)
            return
        now = time.perf_counter()
        self.stats.record_step(len(plan), sum(c.n for c in plan), now - t0)
        row = 0
        ready = []  # (request, its logits row) to sample now
        for c, it in zip(plan, items):
            req = c.req
            self.scheduler.computed(c)
            if it.logits == "none":
                continue
            if it.logits == "all":
                rows = logits[row:row + c.n]
                row += c.n
                self._record_prompt_logprobs(req, c, rows)
                if c.start + c.n < len(req.tokens):
                    continue
                last = rows[-1].copy()
            else:
                last = logits[row]
                row += 1
            # logprobs are the model's own distribution: kept before penalties and grammar masks
            req.raw_logits = last.copy() if req.logprobs else None
            ready.append((req, last))
        if masks is not None:
            try:
                bitmask = masks.result()
                from .constraints import apply_mask
                row_of = {req.id: i for i, req in enumerate(constrained)}
                for req, last in ready:
                    if req.matcher is not None:
                        apply_mask(last, bitmask[row_of[req.id]])
            except Exception as exc:  # a grammar that fails mid-way fails its requests only
                for req in constrained:
                    self._fail(req, exc)
                ready = [(req, last) for req, last in ready if req.matcher is None]
        for req, last in ready:
            if req.max_tokens == 0:  # the prompt only (read for its logprobs): nothing is sampled
                self._finish(req, "length")
            else:
                self._advance(req, last, now)

    def _mask_pool(self):
        if self._masker is None:
            from concurrent.futures import ThreadPoolExecutor
            self._masker = ThreadPoolExecutor(1, thread_name_prefix="qwenc-masks")
        return self._masker

    @staticmethod
    def _fill(reqs):
        """The bitmask rows of these requests' grammars, in order (fill_masks computes them with
        the GIL released)."""
        from .constraints import fill_masks, new_bitmask
        matchers = [r.matcher for r in reqs]
        bitmask = new_bitmask(len(matchers), matchers[0].info)
        fill_masks(matchers, bitmask)
        return bitmask

    def _record_prompt_logprobs(self, req, c, rows):
        # row j is the distribution of the token after position c.start + j
        for j in range(c.n):
            nxt = c.start + j + 1
            if nxt < req.num_prompt and len(req.prompt_lp) == nxt:
                lp, top = row_logprobs(rows[j][:self.model.n_vocab], req.tokens[nxt], req.top_logprobs)
                req.prompt_lp.append(TokenLogprob(req.tokens[nxt], lp, top))

    def _advance(self, req, logits_row, now):
        """Sample the request's next token and stream what it releases."""
        lp = None
        if req.logprobs:
            raw = req.raw_logits
        token = req.sampler.sample(logits_row)
        if req.logprobs:
            value, top = row_logprobs(raw[:self.model.n_vocab], token, req.top_logprobs)
            lp = [TokenLogprob(token, value, top)]
        if req.first_token_at is None:
            req.first_token_at = now
            self.stats.emit("ttft", now - req.submitted_at)
        else:
            self.stats.emit("itl", now - req.last_token_at)
        req.last_token_at = now
        out = Output(req.id)
        if req.prompt_lp is not None and not req.sent_prompt_logprobs:
            out.prompt_logprobs = req.prompt_lp
            req.sent_prompt_logprobs = True
        if token in req.stop_ids:
            self.stats.generated += 1
            return self._finish(req, "stop", out)
        if req.matcher is not None:
            try:
                req.matcher.accept(token)
            except Exception as exc:
                return self._fail(req, exc)
        req.tokens.append(token)
        req.sampler.observe(token)
        self.stats.generated += 1
        out.token_ids = [token]
        out.logprobs = lp
        out.text = req.text.push(token)
        if req.text.stopped or (req.matcher is not None and req.matcher.is_terminated()):
            return self._finish(req, "stop", out)
        if req.num_generated >= req.max_tokens or len(req.tokens) >= req.capacity:
            return self._finish(req, "length", out)
        req.out._put(out)

    def _finish(self, req, reason, out=None):
        if req.id not in self._requests:
            return
        del self._requests[req.id]
        self.scheduler.remove(req)
        out = out or Output(req.id)
        out.text += req.text.finish() if reason != "cancelled" else ""
        out.finish_reason = reason
        out.prompt_tokens = req.num_prompt
        out.completion_tokens = req.num_generated
        out.cached_tokens = req.cached_tokens or 0
        if req.prompt_lp is not None and not req.sent_prompt_logprobs:
            out.prompt_logprobs = req.prompt_lp
        self.stats.finished[reason] = self.stats.finished.get(reason, 0) + 1
        self.stats.prompt_tokens += req.num_prompt
        self.stats.cached_tokens += req.cached_tokens or 0
        req.out._put(out)

    def _fail(self, req, exc):
        if req.id in self._requests:
            del self._requests[req.id]
            self.scheduler.remove(req)
            self.stats.failed += 1
            req.out._put(exc)

    # -- for metrics and tests ---------------------------------------------------------------

    def snapshot(self) -> dict:
        """Counts of the moment (read from another thread: a consistent-enough view)."""
        s = self.scheduler
        return {"running": len(s.running), "waiting": len(s.waiting) + len(self._inbox),
                "kv_blocks_total": self.pool.num_blocks, "kv_blocks_used": self.pool.num_used,
                "kv_blocks_free": self.pool.num_free, "kv_blocks_cached": self.pool.num_cached,
                "preemptions": s.preemptions}


def _is_messages(prompt) -> bool:
    return isinstance(prompt, (list, tuple)) and bool(prompt) and all(isinstance(m, dict) for m in prompt)


class EngineStats:
    """Running totals, and a hook for observations (the server's Prometheus metrics subscribe:
    `stats.listeners.append(fn)`, fn(name, value) called from the engine's thread for "ttft",
    "itl" (seconds) and "step" ((rows, tokens, seconds))). Plain counters: one writer, readers
    tolerate a step's skew."""

    def __init__(self):
        self.submitted = 0
        self.failed = 0
        self.finished = {}
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.generated = 0
        self.steps = 0
        self.step_tokens = 0
        self.step_seconds = 0.0
        self.listeners = []

    def emit(self, name, value):
        for fn in self.listeners:
            fn(name, value)

    def record_step(self, rows, tokens, seconds):
        self.steps += 1
        self.step_tokens += tokens
        self.step_seconds += seconds
        self.emit("step", (rows, tokens, seconds))
