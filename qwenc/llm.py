"""`Model`: what `qwenc.load` returns. The network with its tokenizer, chat template and sampling
defaults, and the ways to use it one sequence at a time.

Many sequences at once go through an `Engine` (qwenc.engine), which batches them into shared
steps; both paths may use one Model together: every step runs under the model's lock, so two
Python threads never interleave inside one.
"""
import os
import threading

import numpy as np

from .errors import Cancelled, InvalidRequest
from .formats.generation_config import resolve_sampling
from .model import Sequence, StepItem, Transformer
from .model.forward import PREFILL_CHUNK
from .engine.generate import Generation, chat_completion, generate_tokens
from .engine.sampling import OPENAI_FIELDS, SAMPLING_FIELDS, SamplingParams, token_bias


# OpenAI chat request fields about several completions or the HTTP exchange: refused by
# Model.chat (which would otherwise hand them to the chat template, where they mean nothing).
_OPENAI_ONLY = frozenset({"n", "stream_options", "user", "store", "metadata", "service_tier", "modalities",
                          "audio", "prediction", "web_search_options", "best_of", "echo", "suffix"})


class Model:
    def __init__(self, cfg, weights, tokenizer=None, context: int = 4096, threads: int = None,
                 generation_defaults: dict = None, chat_template=None, source: str = "",
                 activations: str = "f32", kv_cache: str = "auto"):
        self.transformer = Transformer(cfg, weights, threads=threads, activations=activations, kv_cache=kv_cache)
        self.tokenizer = tokenizer
        try:
            self.context = int(context)
        except (TypeError, ValueError):
            raise InvalidRequest(f"context must be an integer, got {context!r}") from None
        if self.context < 1:
            raise InvalidRequest(f"context must be >= 1, got {context}")
        self.generation_defaults = dict(generation_defaults or {})
        self.chat_template = chat_template
        self.source = source
        eos = list(cfg.eos_token_ids) + list(self.generation_defaults.get("eos_token_id", []))
        if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
            eos.append(tokenizer.eos_token_id)
        self.eos_token_ids = tuple(dict.fromkeys(eos))
        self.lock = threading.RLock()  # held for every step: one model, many threads

    # -- what it is --------------------------------------------------------------------------

    @property
    def config(self):
        return self.transformer.config

    @property
    def weights(self):
        return self.transformer.weights

    @property
    def threads(self) -> int:
        return self.transformer.threads

    @property
    def activations(self) -> str:
        return self.transformer.activations

    @property
    def n_vocab(self) -> int:
        """Tokens that can be produced: the tokenizer's real vocabulary, not the padded rows."""
        if self.tokenizer is not None:
            return min(self.tokenizer.vocab_size, self.config.vocab_size)
        return self.config.vocab_size

    @property
    def name(self) -> str:
        return os.path.basename(str(self.source).rstrip("/")) or "qwenc"

    # -- the forward pass, one sequence (or a few) at a time ---------------------------------

    def new_sequence(self, capacity: int = None) -> Sequence:
        """A sequence with a KV cache of its own for `capacity` tokens (default: the context)."""
        return Sequence.private(self.config, capacity or self.context, self.transformer.kv_dtype)

    def step(self, items) -> np.ndarray:
        """One forward step over StepItems (see Transformer.forward_step), under the lock."""
        with self.lock:
            return self.transformer.forward_step(items)

    def forward(self, seq: Sequence, ids, all_positions=False, cancel=None) -> np.ndarray:
        """Append `ids` to `seq`, in chunks; logits of the last token, or of every token.
        `cancel` (a threading.Event), when set, stops it between chunks with Cancelled (seq then
        holds the chunks already computed)."""
        ids = [int(t) for t in ids]
        if not ids:
            raise InvalidRequest("forward needs at least one token")
        outs = []
        for c in range(0, len(ids), PREFILL_CHUNK):
            if cancel is not None and cancel.is_set():
                raise Cancelled("stopped between prefill chunks")
            part = ids[c:c + PREFILL_CHUNK]
            last = c + PREFILL_CHUNK >= len(ids)
            want = "all" if all_positions else ("last" if last else "none")
            outs.append(self.step([StepItem(seq, part, want)]))
        return np.concatenate(outs) if all_positions else outs[-1][0]

    def decode_batch(self, seqs, tokens) -> np.ndarray:
        """One decode step for several sequences at once: logits [len(seqs), vocab]."""
        if len(seqs) != len(tokens):
            raise InvalidRequest(f"{len(seqs)} sequences but {len(tokens)} tokens")
        return self.step([StepItem(s, [int(t)]) for s, t in zip(seqs, tokens)])

    def logits(self, ids, all_positions=False) -> np.ndarray:
        """Logits for a token sequence on a fresh cache: [vocab], or [len(ids), vocab]."""
        ids = list(ids)
        seq = self.new_sequence(max(len(ids), 1))
        return self.forward(seq, ids, all_positions)

    # -- generation --------------------------------------------------------------------------

    def sampling_params(self, **overrides) -> SamplingParams:
        """Sampling settings: explicit arguments win over generation_config.json's defaults.
        OpenAI's presence_penalty, frequency_penalty and logit_bias ({token id: bias}, keys as
        ints or strings) have no defaults there: off unless given."""
        extra = {k: overrides.pop(k) for k in OPENAI_FIELDS if k in overrides}
        merged = resolve_sampling(self.generation_defaults, **overrides)
        extra = {k: v for k, v in extra.items() if v is not None}
        if "logit_bias" in extra:
            extra["logit_bias"] = token_bias(extra["logit_bias"])
        return SamplingParams(**{k: v for k, v in merged.items() if k in SAMPLING_FIELDS}, **extra)

    def generate_tokens(self, ids, max_tokens=256, temperature=None, top_k=None, top_p=None, min_p=None,
                        repetition_penalty=None, seed=None, stop_token_ids=None, sequence=None, cancel=None):
        """Yield generated token ids one by one.

        Prefills `ids` (reusing the longest prefix already cached in `sequence`, if given), then
        samples up to `max_tokens` tokens. A stop token ends generation and is not yielded; the
        generator's return value is the finish reason, "stop" or "length" (or "cancelled" when
        the threading.Event `cancel` was set: checked between prefill chunks and tokens).
        """
        return generate_tokens(self, ids, max_tokens=max_tokens, stop_token_ids=stop_token_ids,
                               sequence=sequence, cancel=cancel, temperature=temperature, top_k=top_k, top_p=top_p,
                               min_p=min_p, repetition_penalty=repetition_penalty, seed=seed)

    def generate(self, prompt: str, max_tokens=256, stop=None, regex=None, json_schema=None, grammar=None,
                 suffix: str = None, **sampling) -> str:
        """Complete `prompt` (raw text, no chat template) and return the new text.

        suffix: the code after a gap: `prompt` is then the code before it and the model writes
        what goes between (fill in the middle, as Qwen2.5-Coder was trained to).
        At most one constraint: `regex` (the whole output matches it), `json_schema` (a JSON
        schema dict or a pydantic model class: the output is JSON valid against it), `grammar`
        (a Lark or GBNF grammar). A constrained output that ends by itself always matches; one
        cut by max_tokens or a stop string is a prefix of a match."""
        return self._generation(prompt, max_tokens, stop, regex, json_schema, grammar, suffix, sampling).run()

    def stream(self, prompt: str, max_tokens=256, stop=None, regex=None, json_schema=None, grammar=None,
               suffix: str = None, **sampling):
        """Like generate, yielding text pieces as they become final."""
        return iter(self._generation(prompt, max_tokens, stop, regex, json_schema, grammar, suffix, sampling))

    def _generation(self, prompt, max_tokens, stop, regex, json_schema, grammar, suffix, sampling):
        from .engine.constraints import constraint_spec
        constraint = constraint_spec(regex=regex, json_schema=json_schema, grammar=grammar)
        tok = self.tokenizer_or_raise()
        if suffix is None:
            return Generation(self, tok.encode(prompt), max_tokens, stop, constraint=constraint, **sampling)
        ids, ends = tok.fill_in_middle(prompt, suffix)
        return Generation(self, ids, max_tokens, stop, constraint=constraint,
                          stop_token_ids=list(self.eos_token_ids) + ends, **sampling)

    def chat(self, messages, stream=False, max_tokens=256, stop=None, tools=None, tool_choice=None,
             response_format=None, parallel_tool_calls=True, logprobs=False, top_logprobs=0,
             max_completion_tokens=None, **kwargs):
        """An OpenAI-shaped chat completion (a dict, or chunk dicts when stream=True).

        tools / tool_choice ("auto", "none", "required" or {"type": "function", "function":
        {"name": ...}}) as in OpenAI's API: the model's calls come back as message.tool_calls.
        response_format: {"type": "json_object"}, {"type": "json_schema", "json_schema": {...}},
        or a pydantic model class. Qwen3's thinking comes back as message.reasoning_content.
        logprobs / top_logprobs (0-20): choices[0].logprobs.content, as OpenAI gives them.
        max_completion_tokens: OpenAI's newer name for max_tokens (wins when both are given).
        Sampling settings are those of generate() plus presence_penalty, frequency_penalty and
        logit_bias. Other keyword arguments (e.g. enable_thinking=False for Qwen3) are passed to
        the chat template; OpenAI request fields this one-sequence path does not serve (n,
        stream_options, ...) raise InvalidRequest instead of reaching it."""
        served_elsewhere = sorted(set(kwargs) & _OPENAI_ONLY)
        if served_elsewhere:
            raise InvalidRequest(f"model.chat does not take {', '.join(served_elsewhere)} (OpenAI request "
                                 "field(s) for many completions or for the server): use qwenc.Engine or "
                                 "qwenc serve")
        sampling = {k: kwargs.pop(k) for k in list(kwargs) if k in SAMPLING_FIELDS or k in OPENAI_FIELDS}
        if max_completion_tokens is not None:
            max_tokens = max_completion_tokens
        if isinstance(response_format, type):
            response_format = {"type": "json_schema", "json_schema": {"name": response_format.__name__,
                                                                      "schema": response_format}}
        return chat_completion(self, messages, stream=stream, tools=tools, template_kwargs=kwargs,
                               tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls,
                               response_format=response_format, max_tokens=max_tokens, stop=stop,
                               logprobs=logprobs, top_logprobs=top_logprobs, **sampling)

    def tokenizer_or_raise(self):
        if self.tokenizer is None:
            raise InvalidRequest(f"{self.source or 'this model'} has no tokenizer (no tokenizer.json): "
                                 "use model.generate_tokens with token ids")
        return self.tokenizer
