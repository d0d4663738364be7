"""Turning a row of logits into the next token: penalties, warpers, and a seeded draw.

The order follows transformers' logits processors, so that the same settings mean the same thing:
logit bias, repetition penalty, presence and frequency penalties, then temperature, top-k, top-p,
min-p. The selection itself is C (csrc/sample.c: a heap for top-k, a probability floor before
sorting for top-p), since sorting a 151,936-entry vocabulary per token would cost more than the
rest of the step.

Penalties follow the OpenAI API and vLLM: the repetition penalty (transformers' multiplicative
one) counts prompt and output tokens; presence and frequency penalties count output tokens only.
"""
import math
from dataclasses import dataclass, field

import numpy as np

from .. import _ops
from ..errors import InvalidRequest

# The settings a SamplingParams holds that generation_config.json may give defaults for.
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed")
# OpenAI's settings, which a model's files never set: a caller's or nothing.
OPENAI_FIELDS = ("presence_penalty", "frequency_penalty", "logit_bias")


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0        # 0: greedy
    top_k: int = 0                  # 0: off
    top_p: float = 1.0              # 1: off
    min_p: float = 0.0              # 0: off
    repetition_penalty: float = 1.0  # 1: off; >1 discourages tokens already in the sequence
    seed: int = None
    presence_penalty: float = 0.0   # subtracted once from each token already generated
    frequency_penalty: float = 0.0  # subtracted per occurrence in the generated tokens
    logit_bias: dict = field(default=None, hash=False)  # {token id: added to its logit}

    def __post_init__(self):
        # Every setting is checked here, before any compute: a bad one must not cost a prefill.
        for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                     "frequency_penalty"):
            value = getattr(self, name)
            if not _is_real(value) or not math.isfinite(value):
                raise InvalidRequest(f"{name} must be a finite number, got {value!r}")
        if not self.temperature >= 0:
            raise InvalidRequest(f"temperature must be >= 0, got {self.temperature}")
        if _is_real(self.top_k) and not _is_integer(self.top_k) and float(self.top_k).is_integer():
            object.__setattr__(self, "top_k", int(self.top_k))  # 20.0, as JSON writers put it
        if not _is_integer(self.top_k) or self.top_k < 0:
            raise InvalidRequest(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise InvalidRequest(f"min_p must be in [0, 1], got {self.min_p}")
        if not self.repetition_penalty > 0:
            raise InvalidRequest(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise InvalidRequest(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if self.seed is not None and (not _is_integer(self.seed) or not 0 <= self.seed < 2**128):
            # numpy's PCG64 takes any integer in [0, 2**128)
            raise InvalidRequest(f"seed must be an integer in [0, 2**128) or None, got {self.seed!r}")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise InvalidRequest("logit_bias must map token ids to numbers")
            for k, v in self.logit_bias.items():
                if not _is_integer(k) or k < 0:
                    raise InvalidRequest(f"logit_bias keys must be token ids, got {k!r}")
                if not _is_real(v) or not -100 <= v <= 100:
                    raise InvalidRequest(f"logit_bias values must be numbers in [-100, 100], got {v!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _is_real(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def _is_integer(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


class Sampler:
    """Draws tokens for one sequence. Scratch buffers are allocated once, not per token.

    `history` are the tokens before generation (the prompt): they count for the repetition
    penalty only. Tokens passed to observe() after that are the output.

    With a `matcher` (qwenc.engine.constraints), the tokens its grammar does not allow are
    masked out before the draw; the caller feeds each kept token back with `matcher.accept`.
    (A batching engine masks many rows at once with constraints.fill_masks instead.)
    """

    def __init__(self, params: SamplingParams, n_vocab: int, history=(), rng=None, matcher=None):
        self.params = params
        self.matcher = matcher
        self._mask_row = None if matcher is None else np.zeros(matcher.info.n_words, dtype=np.int32)
        self.n_vocab = n_vocab  # real tokens only: padded embedding rows are never drawn
        seed = None if params.seed is None else int(params.seed)
        self.rng = rng if rng is not None else np.random.Generator(np.random.PCG64(seed))
        self._top_k = min(int(params.top_k), n_vocab)  # past the vocabulary, top-k is off anyway
        self._idx = np.empty(n_vocab, dtype=np.int32)
        self._val = np.empty(n_vocab, dtype=np.float32)
        self._seen = np.zeros(n_vocab, dtype=bool)
        self._seen_ids = []
        self._counts = {}  # output token -> occurrences
        bias = params.logit_bias or {}
        if any(k >= n_vocab for k in bias):
            raise InvalidRequest(f"logit_bias names a token id beyond the vocabulary of {n_vocab}")
        self._bias_ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
        self._bias_val = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
        for t in history:
            self._see(t)

    def _see(self, token: int):
        if 0 <= token < self.n_vocab and not self._seen[token]:
            self._seen[token] = True
            self._seen_ids.append(token)

    def observe(self, token: int):
        """Record a generated token (for the penalties)."""
        self._see(token)
        self._counts[token] = self._counts.get(token, 0) + 1

    def _penalize(self, logits):
        p = self.params
        if len(self._bias_ids):
            logits[self._bias_ids] += self._bias_val
        if p.repetition_penalty != 1.0 and self._seen_ids:
            ids = np.fromiter(self._seen_ids, dtype=np.int64, count=len(self._seen_ids))
            picked = logits[ids]
            r = np.float32(p.repetition_penalty)
            logits[ids] = np.where(picked < 0, picked * r, picked / r)
        if (p.presence_penalty or p.frequency_penalty) and self._counts:
            ids = np.fromiter(self._counts.keys(), dtype=np.int64, count=len(self._counts))
            n = np.fromiter(self._counts.values(), dtype=np.float32, count=len(self._counts))
            logits[ids] -= np.float32(p.presence_penalty) + np.float32(p.frequency_penalty) * n

    def sample(self, logits: np.ndarray) -> int:
        """Next token from a float32 logits row (modified in place)."""
        p = self.params
        if self.matcher is not None:
            self.matcher.apply(logits, self._mask_row)  # the whole row: padded entries too
        row = logits[:self.n_vocab]
        self._penalize(row)
        if p.temperature == 0:
            return int(_ops.argmax(row))
        u = self.rng.random()
        return int(_ops.sample(row, p.temperature, self._top_k, p.top_p, p.min_p, u, self._idx, self._val))


def top_logprobs_count(value) -> int:
    """OpenAI's top_logprobs: how many of the most likely tokens to report, None or 0-20."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= 20:
        raise InvalidRequest(f"top_logprobs must be an integer in [0, 20], got {value!r}")
    return int(value)


def token_bias(bias) -> dict:
    """OpenAI's logit_bias ({"123": 5.0}, keys as strings) as {int: float}."""
    if not isinstance(bias, dict):
        raise InvalidRequest("logit_bias must be an object mapping token ids to numbers")
    out = {}
    for k, v in bias.items():
        try:
            key = int(k)
        except (TypeError, ValueError):
            raise InvalidRequest(f"logit_bias key {k!r} is not a token id") from None
        out[key] = v
    return out


@dataclass
class TokenLogprob:
    token: int
    logprob: float
    top: list  # [(token id, logprob)], most likely first


def logprobs(row: np.ndarray, token: int, top: int = 0):
    """log-softmax of a raw logits row at `token`, and the `top` most likely tokens with theirs:
    (logprob, [(token, logprob), ...]). Computed in float64 from the model's own distribution,
    before penalties and temperature (as OpenAI and vLLM report them)."""
    x = row.astype(np.float64)
    mx = x.max()
    lse = mx + math.log(np.exp(x - mx).sum())
    best = []
    if top > 0:
        k = min(top, len(x))
        idx = np.argpartition(-x, k - 1)[:k]
        idx = idx[np.lexsort((idx, -x[idx]))]
        best = [(int(i), float(x[i] - lse)) for i in idx]
    return float(x[token] - lse), best
