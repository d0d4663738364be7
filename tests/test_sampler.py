"""Sampling against transformers' logits warpers: same support, same probabilities."""
import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

from qwenc import _ops
from qwenc.engine.sampling import Sampler, SamplingParams


def reference_probs(logits, temperature, top_k, top_p, min_p):
    scores = torch.tensor(logits, dtype=torch.float32)[None]
    warpers = [TemperatureLogitsWarper(temperature)]
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1:
        warpers.append(TopPLogitsWarper(top_p))
    if min_p > 0:
        warpers.append(MinPLogitsWarper(min_p))
    for w in warpers:
        scores = w(None, scores)
    return torch.softmax(scores.double(), -1)[0].numpy()


def implied_probs(logits, temperature, top_k, top_p, min_p, grid=20000):
    """Our sampler's distribution, read off deterministically by sweeping u over [0, 1)."""
    n = len(logits)
    idx, val = np.empty(n, np.int32), np.empty(n, np.float32)
    counts = np.zeros(n)
    for u in (np.arange(grid) + 0.5) / grid:
        row = logits.copy()
        counts[_ops.sample(row, temperature, top_k, top_p, min_p, u, idx, val)] += 1
    return counts / grid


SETTINGS = [
    (1.0, 0, 1.0, 0.0), (0.7, 0, 1.0, 0.0), (1.0, 5, 1.0, 0.0), (0.7, 20, 0.8, 0.0),
    (1.0, 0, 0.9, 0.0), (1.3, 0, 0.5, 0.0), (1.0, 0, 1.0, 0.05), (0.8, 10, 0.95, 0.1), (1.0, 1, 1.0, 0.0),
]


@pytest.mark.parametrize("temperature,top_k,top_p,min_p", SETTINGS)
def test_distribution_matches_transformers(temperature, top_k, top_p, min_p):
    logits = (np.random.default_rng(3).standard_normal(64) * 2).astype(np.float32)
    ref = reference_probs(logits, temperature, top_k, top_p, min_p)
    ours = implied_probs(logits, temperature, top_k, top_p, min_p)
    drawn = set(np.flatnonzero(ours))
    assert drawn <= set(np.flatnonzero(ref > 0)), "drew a token the warpers remove"
    assert set(np.flatnonzero(ref > 2.0 / 20000)) <= drawn, "never drew a token the warpers keep"
    np.testing.assert_allclose(ours, ref, atol=2.0 / 20000 + 1e-9)


def test_full_vocab_top_p_support_matches():
    """Without top-k, top-p over a 151,936-entry row: the nucleus boundary is exact."""
    logits = (np.random.default_rng(5).standard_normal(151936) * 3).astype(np.float32)
    ref = reference_probs(logits, 1.0, 0, 0.8, 0.0)
    support = np.flatnonzero(ref > 0)
    idx, val = np.empty(151936, np.int32), np.empty(151936, np.float32)
    last = _ops.sample(logits.copy(), 1.0, 0, 0.8, 0.0, 1 - 1e-12, idx, val)  # u near 1: the last kept
    first = _ops.sample(logits.copy(), 1.0, 0, 0.8, 0.0, 0.0, idx, val)
    assert first == int(np.argmax(logits))
    weakest = support[np.argmin(ref[support])]
    assert last == weakest


def test_greedy_is_first_argmax():
    row = np.array([1.0, 3.0, 3.0, 2.0], np.float32)
    assert Sampler(SamplingParams(temperature=0), 4).sample(row) == 1


def test_padding_ids_never_sampled():
    row = np.zeros(10, np.float32)
    row[8:] = 100.0  # padded rows of the embedding with huge logits
    s = Sampler(SamplingParams(temperature=1.0, seed=0), 8)
    assert all(s.sample(row.copy()) < 8 for _ in range(200))
    assert Sampler(SamplingParams(temperature=0), 8).sample(row.copy()) < 8


def test_seed_reproducible_and_seed_matters():
    logits = np.random.default_rng(0).standard_normal(1000).astype(np.float32)

    def draws(seed):
        s = Sampler(SamplingParams(temperature=1.0, top_p=0.95, seed=seed), 1000)
        return [s.sample(logits.copy()) for _ in range(50)]

    assert draws(42) == draws(42)
    assert draws(42) != draws(43)


def test_repetition_penalty_matches_transformers():
    logits = np.random.default_rng(1).standard_normal(50).astype(np.float32) * 3
    history = [3, 7, 7, 11, 20]
    ref = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([history]), torch.tensor(logits)[None])[0].numpy()
    s = Sampler(SamplingParams(temperature=0, repetition_penalty=1.3), 50, history=history)
    row = logits.copy()
    s._penalize(row)
    np.testing.assert_allclose(row, ref, rtol=1e-6)


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(top_k=-1),
                                 dict(top_k=2.5), dict(min_p=2), dict(repetition_penalty=0)])
def test_invalid_params_rejected(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_top_p_without_sorted_candidates_raises():
    """When the candidates cannot be sorted, top-p would keep the wrong nucleus: no draw then."""
    logits = (np.random.default_rng(9).standard_normal(64) * 2).astype(np.float32)
    idx, val = np.empty(64, np.int32), np.empty(64, np.float32)
    _ops._sample_fail_allocs(1)
    try:
        with pytest.raises(MemoryError, match="top-p"):
            _ops.sample(logits.copy(), 1.0, 0, 0.5, 0.0, 0.999, idx, val)
    finally:
        _ops._sample_fail_allocs(0)
    # the next call has its memory and draws from the true nucleus
    ref = reference_probs(logits, 1.0, 0, 0.5, 0.0)
    assert ref[_ops.sample(logits.copy(), 1.0, 0, 0.5, 0.0, 0.999, idx, val)] > 0


@pytest.mark.parametrize("min_p", [0.0, 0.1])
@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_nan_logits_still_give_a_token_id(top_p, min_p):
    """A model that produced NaN leaves no candidate; the draw must still be an id of the row
    (it read idx[-1] before)."""
    n = 40
    idx, val = np.full(n, -7, np.int32), np.empty(n, np.float32)
    for u in (0.0, 0.5, 0.999):
        token = _ops.sample(np.full(n, np.nan, np.float32), 1.0, 0, top_p, min_p, u, idx, val)
        assert 0 <= token < n


@pytest.mark.parametrize("seed", [-1, 2**128, 1.5, "7", True])
def test_invalid_seed_rejected_at_construction(seed):
    from qwenc import InvalidRequest
    with pytest.raises(InvalidRequest, match="seed"):
        SamplingParams(temperature=1.0, seed=seed)


@pytest.mark.parametrize("bad", [dict(temperature=float("nan")), dict(top_p=None), dict(top_k="3"),
                                 dict(min_p=float("inf")), dict(repetition_penalty="1.1")])
def test_wrongly_typed_params_are_invalid_requests(bad):
    from qwenc import InvalidRequest
    with pytest.raises(InvalidRequest):
        SamplingParams(**bad)


def test_huge_top_k_means_off():
    logits = (np.random.default_rng(4).standard_normal(50) * 2).astype(np.float32)
    a = Sampler(SamplingParams(temperature=1.0, top_k=2**70, seed=1), 50).sample(logits.copy())
    b = Sampler(SamplingParams(temperature=1.0, top_k=0, seed=1), 50).sample(logits.copy())
    assert a == b
