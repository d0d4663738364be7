"""Turning a row of logits into the next token: penalties, warpers, and a seeded draw.

The order follows transformers' logits processors, so that the same settings mean the same thing:
repetition penalty, then temperature, top-k, top-p, min-p. The selection itself is C
(csrc/sample.c: a heap for top-k, a probability floor before sorting for top-p), since sorting a
151,936-entry vocabulary per token would cost more than the rest of the step.
"""
from dataclasses import dataclass

import numpy as np

from .. import _ops

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
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")


class Sampler:
    """Draws tokens for one sequence. Scratch buffers are allocated once, not per token.

    With a `matcher` (qwenc.engine.constraints), the tokens its grammar does not allow are
    masked out before the draw; the caller feeds each kept token back with `matcher.accept`.
    (A batching engine masks many rows at once with constraints.fill_masks instead.)
    """

    def __init__(self, params: SamplingParams, n_vocab: int, history=(), matcher=None):
        self.params = params
        self.matcher = matcher
        self._mask_row = None if matcher is None else np.zeros(matcher.info.n_words, dtype=np.int32)
        self.n_vocab = n_vocab  # real tokens only: padded embedding rows are never drawn
        self.rng = np.random.Generator(np.random.PCG64(params.seed))
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
        if self.matcher is not None:
            self.matcher.apply(logits, self._mask_row)  # the whole row: padded entries too
        row = logits[:self.n_vocab]
        if p.repetition_penalty != 1.0 and self._seen_ids:
            self._penalize(row)
        if p.temperature == 0:
            return int(_ops.argmax(row))
        u = self.rng.random()
        return int(_ops.sample(row, p.temperature, p.top_k, p.top_p, p.min_p, u, self._idx, self._val))
