"""The AVX2 path's joined 16-bit act rows (csrc/kernels.h): each value's two level codes joined
into one int16, so each weight code meets its act value in one 16-bit product instead of one
byte product per level.

Oracles: the layout as kernels.h describes it, built here in numpy; and the AVX2 kernels on the
plain two-level act rows (dot_rows_act, tested against the dequantized weights in test_quant.py),
whose bits the joined kernels must give exactly: the block sums are exact integers either way and
the float work after them is done in the same order. The falsifiers show the comparison can see
a joined row in the wrong order or with the wrong scale.
"""
import numpy as np
import pytest

from qwenc import _ops, _quant
from test_quant import BLOCK_TYPES, CODE, act_inputs, random_blocks, synthetic
from test_repack import K_CASES, bits_equal

QK = 32


@pytest.fixture
def avx2():
    """The AVX2 path on both extension modules; a CPU without AVX2 has no joined kernels (the
    plain path's products are checked in test_quant.py)."""
    if "avx2" not in _ops.simd_paths():
        pytest.skip("CPU without AVX2/FMA/F16C: no joined kernels")
    prev = _ops.set_simd_path("avx2"), _quant.set_simd_path("avx2")
    assert _quant.has_joined_kernels()
    yield
    _ops.set_simd_path(prev[0])
    _quant.set_simd_path(prev[1])


def act_rows(K, M, seed):
    x = np.ascontiguousarray(act_inputs(K, np.random.default_rng(seed))[np.arange(M) % 4]
                             * np.float32(1 + np.arange(M)[:, None] % 5))
    return x, np.ascontiguousarray(_quant.quantize_activations(x, CODE["Q8_0"], bits=16))


def joined_rows(xq, K, order=(0, 2, 1, 3)):
    """kernels.h's joined rows from 16-bit act rows: two 8-bit act rows back to back (codes, then d
    and s per block, then the code sums of 16 values); per 4 values the int16s 256 q1 + q2 in the
    order given; then level 2's d and s."""
    half = K + 8 * (K // QK) + 2 * (K // 16)
    out = []
    for row in xq:
        q1 = row[:K].view(np.int8).astype(np.int16)
        j = (256 * q1 + row[half:half + K].view(np.int8)).reshape(-1, 4)[:, list(order)].reshape(-1)
        out.append(np.concatenate([j.view(np.uint8), row[half + K:half + K + 8 * (K // QK)]]))
    return np.stack(out)


def test_joined_rows_follow_the_layout():
    for K in (32, 96, 288, 768):
        for M in (1, 3, 5):
            _, xq = act_rows(K, M, K + M)
            got = _quant.join_activations(xq, K)
            assert got.shape == (M, 2 * K + 8 * (K // QK))
            np.testing.assert_array_equal(got, joined_rows(xq, K), err_msg=f"K={K} M={M}")


def test_joined_rows_refuse_a_wrong_width():
    _, xq = act_rows(64, 2, 1)
    with pytest.raises(ValueError):
        _quant.join_activations(xq[:, :-1], 64)
    with pytest.raises(ValueError):
        _quant.join_activations(xq, 96)


@pytest.mark.parametrize("name", BLOCK_TYPES)
@pytest.mark.parametrize("blocks", ["synthetic", "random"])
def test_joined_products_equal_the_two_level_ones(avx2, name, blocks):
    """Every block type on 1, 3, 5 and 9 blocks (or 1 and 3 superblocks), synthetic weights and
    random bytes (every code pattern, Q8_0's -128 included): the joined kernel's bits are the
    two-level kernel's."""
    for K in K_CASES[name]:
        rows = 11
        data = (synthetic(name, rows, K, seed=K) if blocks == "synthetic"
                else random_blocks(name, rows, K, np.random.default_rng(K)))
        x, _ = act_rows(K, 4, K)
        x[1, ::7] *= 40  # level-1 codes at their largest in some blocks
        xq = np.ascontiguousarray(_quant.quantize_activations(x, CODE["Q8_0"], bits=16))
        xj = _quant.join_activations(xq, K)
        for m in range(len(xq)):
            want = _quant.dot_rows_act(data, CODE[name], rows, K, xq[m], bits=16)
            got = _quant.dot_rows_joined(data, CODE[name], rows, K, xj[m])
            assert np.isfinite(want).all()
            assert bits_equal(got, want), (name, K, m, got - want)


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_matmul_on_joined_rows_gives_each_rows_bits(avx2, name):
    """The 16-bit matmul on the AVX2 path (joined rows, stored and repacked weights) gives for any
    number of act rows, odd ones included, on vertical blocks or not (both kinds of count below),
    each row's two-level product alone."""
    N, K = 13, K_CASES[name][-1]
    data = synthetic(name, N, K, seed=9)
    packed, r8 = _ops.repack(data.reshape(-1), CODE[name], N, K)
    x, xq = act_rows(K, 17, 3)
    want = np.stack([_quant.dot_rows_act(data, CODE[name], N, K, xq[m], bits=16) for m in range(17)])
    for M in (1, 2, 3, 5, 6, 9, 11, 16, 17):
        for w, dtype in ((data.reshape(-1), CODE[name]), (packed, r8)):
            y = np.full((M, N), np.nan, np.float32)
            _ops.matmul(w, dtype, N, K, x[:M], y, None, 16)
            assert bits_equal(y, want[:M]), (name, M, dtype)


def test_vertical_blocks_where_they_pay(avx2):
    """A vertical block costs the same for 1 to 8 rows: the AVX2 path takes them for 6-8 rows and
    from 11 on (fewer lanes wasted than the two-level kernels cost), never on the plain path."""
    assert [m for m in range(1, 41) if _ops.takes_vertical(m)] == [6, 7, 8] + list(range(11, 41))
    assert not _ops.takes_vertical(0)
    _ops.set_simd_path("plain")
    try:
        assert not any(_ops.takes_vertical(m) for m in range(1, 41))
    finally:
        _ops.set_simd_path("avx2")


@pytest.mark.parametrize("name", ["Q4_1", "Q5_1", "Q4_K", "Q5_K"])
def test_long_rows_with_mins_give_each_rows_bits(avx2, name):
    """Rows of 41 blocks (7 superblocks, 56 sub-blocks): the vertical kernels fold the mins' sums
    in runs of sub-blocks, and a run's end, a short last run and both act blocks (5 and 17 rows)
    keep each row's two-level bits."""
    N, K = 9, 1792 if name.endswith("_K") else 1312
    data = random_blocks(name, N, K, np.random.default_rng(K))
    x, xq = act_rows(K, 17, 11)
    want = np.stack([_quant.dot_rows_act(data, CODE[name], N, K, xq[m], bits=16) for m in range(17)])
    packed, r8 = _ops.repack(data.reshape(-1), CODE[name], N, K)
    for M in (5, 17):
        y = np.full((M, N), np.nan, np.float32)
        _ops.matmul(packed, r8, N, K, x[:M], y, None, 16)
        assert np.isfinite(want).all()
        assert bits_equal(y, want[:M]), (name, M)


@pytest.mark.parametrize("name", ["Q5_0", "Q8_0", "Q4_K", "Q6_K"])
def test_falsifier_joined_rows_in_natural_order(avx2, name):
    """A joined row in the values' own order (no j0, j2, j1, j3) gives other products: the
    comparison above depends on the order kernels.h gives."""
    K = K_CASES[name][-1]
    data = synthetic(name, 8, K, seed=4)
    _, xq = act_rows(K, 1, 5)
    want = _quant.dot_rows_act(data, CODE[name], 8, K, xq[0], bits=16)
    natural = joined_rows(xq, K, order=(0, 1, 2, 3))[0]
    assert not np.allclose(_quant.dot_rows_joined(data, CODE[name], 8, K, natural), want, rtol=1e-3)
    assert bits_equal(_quant.dot_rows_joined(data, CODE[name], 8, K, joined_rows(xq, K)[0]), want)


def test_falsifier_level_one_scale(avx2):
    """Level 1's scale in place of level 2's (a joined code is in level 2's units) is caught."""
    K = 256
    data = synthetic("Q4_K", 8, K, seed=6)
    _, xq = act_rows(K, 1, 7)
    want = _quant.dot_rows_act(data, CODE["Q4_K"], 8, K, xq[0], bits=16)
    bad = joined_rows(xq, K)[0].copy()
    bad[2 * K:2 * K + 4 * (K // QK)] = xq[0, K:K + 4 * (K // QK)]  # level 1's d
    assert not np.allclose(_quant.dot_rows_joined(data, CODE["Q4_K"], 8, K, bad), want, rtol=1e-3)
