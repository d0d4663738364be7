"""Turning a row of logits into the next token: penalties, warpers, and a seeded draw.

The order follows transformers' logits processors, so that the same settings mean the same thing:
repetition penalty, then temperature, top-k, top-p, min-p. The selection itself is C
(csrc/sample.c: a heap for top-k, a probability floor before sorting for top-p), since sorting a
151,936-entry vocabulary per token would cost more than the rest of the step.
"""
import math
from dataclasses import dataclass

import numpy as np

from .. import _ops
from ..errors import InvalidRequest

# The settings a SamplingParams holds (what Model.sampling_params takes from a caller).
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed")


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0        # 0: greedy
    top_k: int = 0                  # 0: off
    top_p: float = 1.0              # 1: off
    min_p: float = 0.0              # 0: off
    repetition_penalty: float = 1.0  # 1: off; >1 discourages tokens already in the sequence
    seed: int = None

    def __post_init__(self):
        # Every setting is checked here, before any compute: a bad one must not cost a prefill.
        for name in ("temperature", "top_p", "min_p", "repetition_penalty"):
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
        if self.seed is not None and (not _is_integer(self.seed) or not 0 <= self.seed < 2**128):
            # numpy's PCG64 takes any integer in [0, 2**128)
            raise InvalidRequest(f"seed must be an integer in [0, 2**128) or None, got {self.seed!r}")


def _is_real(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def _is_integer(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


class Sampler:
    """Draws tokens for one sequence. Scratch buffers are allocated once, not per token."""

    def __init__(self, params: SamplingParams, n_vocab: int, history=()):
        self.params = params
        self.n_vocab = n_vocab  # real tokens only: padded embedding rows are never drawn
        self.rng = np.random.Generator(np.random.PCG64(None if params.seed is None else int(params.seed)))
        self._top_k = min(int(params.top_k), n_vocab)  # past the vocabulary, top-k is off anyway
        self._idx = np.empty(n_vocab, dtype=np.int32)
        self._val = np.empty(n_vocab, dtype=np.float32)
        self._seen = np.zeros(n_vocab, dtype=bool)
        self._seen_ids = []
        for t in history:
            self.observe(t)

    def observe(self, token: int):
        """Record a token of the sequence, for the repetition penalty."""
        if 0 <= token < self.n_vocab and not self._seen[token]:
            self._seen[token] = True
            self._seen_ids.append(token)

    def _penalize(self, logits):
        ids = np.fromiter(self._seen_ids, dtype=np.int64, count=len(self._seen_ids))
        picked = logits[ids]
        p = np.float32(self.params.repetition_penalty)
        logits[ids] = np.where(picked < 0, picked * p, picked / p)

    def sample(self, logits: np.ndarray) -> int:
        """Next token from a float32 logits row (modified in place)."""
        p = self.params
        row = logits[:self.n_vocab]
        if p.repetition_penalty != 1.0 and self._seen_ids:
            self._penalize(row)
        if p.temperature == 0:
            return int(_ops.argmax(row))
        u = self.rng.random()
        return int(_ops.sample(row, p.temperature, self._top_k, p.top_p, p.min_p, u, self._idx, self._val))
