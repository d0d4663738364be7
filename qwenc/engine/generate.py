"""Text in, text out: prompts to token ids, generated ids to streamed text, chats to OpenAI shapes.

`Generation` is one completion: iterate it for text pieces (complete UTF-8, never part of a stop
string), then read `finish_reason` and the token counts. `ChatSession` keeps a conversation and its
KV cache, so each turn prefills only what the previous turns did not already cache.
"""
import operator
import threading
import time
import uuid

import numpy as np

from ..errors import Cancelled, ContextLengthExceeded, InvalidRequest
from ..text.textstream import TextStream
from ..text.toolcalls import prepare_messages
from .sampling import Sampler, TokenLogprob, top_logprobs_count
from .sampling import logprobs as row_logprobs


def _require_tokenizer(model):
    if model.tokenizer is None:
        raise InvalidRequest(f"{model.source or 'this model'} has no tokenizer (no tokenizer.json): "
                         "use model.generate_tokens with token ids")
    return model.tokenizer


def _max_tokens(value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise InvalidRequest(f"max_tokens must be an integer >= 0, got {value!r}")
    return int(value)


def _token_ids(ids, what) -> list:
    try:
        return [operator.index(t) for t in ids]
    except TypeError:
        raise InvalidRequest(f"{what} must be integers, got {ids!r}"[:200]) from None


def generate_tokens(model, ids, max_tokens=256, stop_token_ids=None, sequence=None, cancel=None, matcher=None,
                    observe=None, **sampling):
    """Yield generated token ids one by one (see Model.generate_tokens).

    matcher: a constraints.Matcher (or ThinkingGate): its grammar masks every draw, and the
    generation stops as soon as the grammar can take nothing but EOS. observe: called as
    observe(token, logits) before each token is yielded, with the model's own logits row
    (before penalties, temperature and masks)."""
    # Everything the request says is checked before the prefill: a bad setting costs nothing.
    params = model.sampling_params(**sampling)
    max_tokens = _max_tokens(max_tokens)
    ids = _token_ids(ids, "prompt token ids")
    if not ids:
        raise InvalidRequest("generation needs at least one prompt token")
    stops = set(model.eos_token_ids if stop_token_ids is None else _token_ids(stop_token_ids, "stop_token_ids"))
    seq = sequence if sequence is not None else model.new_sequence()
    if len(ids) > seq.capacity:
        raise ContextLengthExceeded(
            f"context_length_exceeded: the prompt has {len(ids)} tokens, the context holds {seq.capacity}")
    # Keep the cached prefix, but always recompute at least the last prompt token's logits.
    keep = min(seq.common_prefix(ids), len(ids) - 1)
    seq.truncate(keep)
    try:
        logits = model.forward(seq, ids[keep:], cancel=cancel)
    except Cancelled:
        return "cancelled"
    sampler = Sampler(params, model.n_vocab, history=ids, matcher=matcher)
    for i in range(max_tokens):
        raw = logits.copy() if observe is not None else None  # the sampler works on the row in place
        token = sampler.sample(logits)
        if token in stops:
            return "stop"
        if observe is not None:
            observe(token, raw)
        if matcher is not None:
            matcher.accept(token)
        yield token
        sampler.observe(token)
        if matcher is not None and matcher.is_terminated():
            return "stop"
        if i + 1 == max_tokens or len(seq) + 1 > seq.capacity:
            break
        if cancel is not None and cancel.is_set():
            return "cancelled"
        logits = model.forward(seq, [token])
    return "length"


class Generation:
    """One completion of `prompt_ids`, produced lazily as text pieces.

    After iteration: `text`, `finish_reason` ("stop", "length", or "cancelled" after cancel()),
    `prompt_tokens`, `completion_tokens`, `token_ids`, and timings `prefill_s` / `decode_s`.
    `cancel()` may be called from any thread: the generation stops at the next prefill chunk or
    token.
    """

    def __init__(self, model, prompt_ids, max_tokens=256, stop=None, sequence=None, skip_special_tokens=True,
                 stop_token_ids=None, constraint=None, thinking=None, logprobs=False, top_logprobs=0, **sampling):
        """constraint: what the output must match (see constraints.compile_constraint: a
        response_format dict, a JSON schema, a pydantic class, or a compiled Grammar); compiled
        here, so a bad one raises InvalidRequest before any token. thinking: None, or the phase
        a chat reply starts in (constraints.thinking_phase): the grammar then applies after
        the model's <think>...</think> part. logprobs: keep a TokenLogprob per generated token
        in `logprobs`, with the `top_logprobs` (0-20) most likely tokens."""
        self.top_logprobs = top_logprobs_count(top_logprobs)
        self.logprobs = [] if logprobs or self.top_logprobs else None
        self.model = model
        self.prompt_ids = list(prompt_ids)
        self.max_tokens = _max_tokens(max_tokens)
        self.stream = TextStream(_require_tokenizer(model), stop or (), skip_special_tokens)
        self.sequence = sequence
        self.stop_token_ids = stop_token_ids
        self.sampling = sampling
        model.sampling_params(**sampling)  # validate now, not at the first token
        self.grammar = _compile(model, constraint)
        self.thinking = thinking
        self.token_ids = []
        self.cached_tokens = 0  # prompt tokens whose KV the sequence already held
        self.finish_reason = None
        self.prefill_s = self.decode_s = 0.0
        self._cancel = threading.Event()

    def cancel(self):
        self._cancel.set()

    @property
    def prompt_tokens(self):
        return len(self.prompt_ids)

    @property
    def completion_tokens(self):
        return len(self.token_ids)

    @property
    def text(self):
        return self.stream.text

    def __iter__(self):
        if self.max_tokens == 0:
            self.finish_reason = "length"
            return
        gen = generate_tokens(self.model, self.prompt_ids, max_tokens=self.max_tokens, sequence=self.sequence,
                              stop_token_ids=self.stop_token_ids, cancel=self._cancel, matcher=self._matcher(),
                              observe=self._observe if self.logprobs is not None else None, **self.sampling)
        if self.sequence is not None:
            self.cached_tokens = min(self.sequence.common_prefix(self.prompt_ids), len(self.prompt_ids) - 1)
        start = time.perf_counter()
        first = None
        reason = "length"
        try:
            while True:
                try:
                    token = next(gen)
                except StopIteration as end:
                    reason = end.value or "length"
                    break
                if first is None:
                    first = time.perf_counter()
                self.token_ids.append(token)
                piece = self.stream.push(token)
                if piece:
                    yield piece
                if self.stream.stopped:
                    reason = "stop"
                    break
        finally:
            gen.close()
            end_t = time.perf_counter()
            self.prefill_s = (first or end_t) - start
            self.decode_s = end_t - (first or end_t)
            if self.finish_reason is None:
                self.finish_reason = reason
        tail = self.stream.finish()
        if tail:
            yield tail

    def run(self) -> str:
        for _ in self:
            pass
        return self.text

    def _observe(self, token, row):
        value, top = row_logprobs(row[:self.model.n_vocab], token, self.top_logprobs)
        self.logprobs.append(TokenLogprob(token, value, top))

    def _matcher(self):
        if self.grammar is None:
            return None
        from .constraints import ThinkingGate
        matcher = self.grammar.matcher()
        if self.thinking not in (None, "answer") and matcher.info.token_id("</think>") is not None:
            return ThinkingGate(matcher, self.thinking)
        return matcher


def _compile(model, constraint):
    """A compiled Grammar (or None) for a Generation's constraint."""
    if constraint is None:
        return None
    from .constraints import Grammar, compile_constraint, tokenizer_info
    if isinstance(constraint, Grammar):
        return constraint
    return compile_constraint(tokenizer_info(model), constraint)


# ---------------------------------------------------------------- OpenAI-shaped chat

def _completion_id():
    return "chatcmpl-" + uuid.uuid4().hex[:24]


def _usage(g: Generation):
    return {"prompt_tokens": g.prompt_tokens, "completion_tokens": g.completion_tokens,
            "total_tokens": g.prompt_tokens + g.completion_tokens}


def finite_logprob(v: float) -> float:
    return max(v, -9999.0) if np.isfinite(v) else -9999.0  # JSON has no -inf (a masked-out token)


def chat_logprobs(tok, lps, token_text=None):
    """OpenAI's chat logprobs ({"content": [{token, logprob, bytes, top_logprobs}]}) of TokenLogprobs."""
    if token_text is None:
        def token_text(t):
            return tok.token_bytes(t).decode("utf-8", "replace")
    return {"content": [{"token": token_text(lp.token), "logprob": finite_logprob(lp.logprob),
                         "bytes": list(tok.token_bytes(lp.token)),
                         "top_logprobs": [{"token": token_text(t), "logprob": finite_logprob(v),
                                           "bytes": list(tok.token_bytes(t))} for t, v in lp.top]}
                        for lp in lps]}


def render_chat(model, messages, add_generation_prompt=True, tools=None, **template_kwargs) -> str:
    """The prompt of OpenAI-shaped chat messages: the one place messages meet the template, so
    every path (chat requests, the engine, /tokenize, sessions) reads tool-call history alike."""
    return _require_tokenizer(model).apply_chat_template(prepare_messages(list(messages)), add_generation_prompt,
                                                         tools, **template_kwargs)


def chat_completion(model, messages, stream=False, tools=None, template_kwargs=None, tool_choice=None,
                    parallel_tool_calls=True, response_format=None, **options):
    """An OpenAI chat.completion dict, or (stream=True) an iterator of chat.completion.chunk dicts
    whose last one carries finish_reason and usage. The structured parts (tools, tool_choice,
    response_format, Qwen3's reasoning) are those of chat_request.ChatRequest."""
    from .chat_request import ChatRequest
    request = ChatRequest(model, messages, tools, tool_choice, parallel_tool_calls, response_format,
                          template_kwargs)
    gen = Generation(model, model.tokenizer.encode(request.prompt), constraint=request.constraint,
                     thinking=request.thinking, **options)
    meta = {"id": _completion_id(), "created": int(time.time()), "model": model.name}
    if stream:
        return _chat_chunks(gen, meta, request)
    parser = request.parser()
    parser.push(gen.run())
    parser.finish()
    lp = chat_logprobs(model.tokenizer, gen.logprobs) if gen.logprobs is not None else None
    return {**meta, "object": "chat.completion",
            "choices": [{"index": 0, "message": parser.message(),
                         "finish_reason": request.finish_reason(gen.finish_reason, parser), "logprobs": lp}],
            "usage": _usage(gen)}


def _chat_chunks(gen: Generation, meta, request):
    def chunk(delta, finish_reason=None, logprobs=None, **extra):
        return {**meta, "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": logprobs}],
                **extra}
    sent = 0

    def new_logprobs():  # the tokens since the last chunk that carried some (text may be held back)
        nonlocal sent
        if not gen.logprobs or sent == len(gen.logprobs):
            return None
        lps, sent = gen.logprobs[sent:], len(gen.logprobs)
        return chat_logprobs(gen.model.tokenizer, lps)
    parser = request.parser()
    yield chunk({"role": "assistant", "content": ""})
    for piece in gen:
        for delta in parser.push(piece):
            yield chunk(delta, logprobs=new_logprobs())
    for delta in parser.finish():
        yield chunk(delta, logprobs=new_logprobs())
    lp = new_logprobs()
    if lp:
        yield chunk({}, logprobs=lp)
    yield chunk({}, request.finish_reason(gen.finish_reason, parser), usage=_usage(gen))


# ---------------------------------------------------------------- multi-turn sessions

class ChatSession:
    """A conversation whose KV cache carries over between turns.

    Each turn renders the whole history with the chat template (templates may rewrite earlier
    turns, e.g. Qwen3 drops old <think> blocks), then reuses the longest cached prefix of it.
    """

    def __init__(self, model, system=None, template_kwargs=None, **options):
        _require_tokenizer(model)
        self.model = model
        self.system = system
        self.template_kwargs = dict(template_kwargs or {})
        self.options = options
        self.sequence = model.new_sequence()
        self.messages = []
        self.reset()

    def reset(self):
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.sequence.truncate(0)

    def send(self, text, **options) -> Generation:
        """Add a user turn; returns the Generation of the reply (iterate it to stream). The reply
        is recorded in the history when the iteration ends, even if it is cut short."""
        self.messages.append({"role": "user", "content": text})
        prompt = render_chat(self.model, self.messages, **self.template_kwargs)
        ids = self.model.tokenizer.encode(prompt)
        if len(ids) >= self.sequence.capacity:
            self.messages.pop()
            raise ContextLengthExceeded(
                f"context_length_exceeded: the conversation needs {len(ids)} tokens, the context holds "
                f"{self.sequence.capacity}; /reset to start over")
        gen = Generation(self.model, ids, sequence=self.sequence, **{**self.options, **options})
        return _RecordingGeneration(gen, self.messages)

    @property
    def cached_tokens(self):
        return len(self.sequence)


class _RecordingGeneration:
    """Iterates a Generation and appends the assistant's reply to the history at the end."""

    def __init__(self, gen, messages):
        self.gen, self.messages = gen, messages

    def __getattr__(self, name):
        return getattr(self.gen, name)

    def __iter__(self):
        try:
            yield from self.gen
        finally:
            self.messages.append({"role": "assistant", "content": self.gen.text})

    def run(self) -> str:
        for _ in self:
            pass
        return self.gen.text
