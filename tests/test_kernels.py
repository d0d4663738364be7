"""Each model kernel against a numpy reference, on every kernel path the CPU has (plain C always)."""
import contextlib

import numpy as np
import pytest

from qwenc import _ops
from qwenc.formats.tensors import BF16, F16, F32

rng = np.random.default_rng(1234)


@pytest.fixture
def path(simd):
    """The kernel path of the test: conftest's `simd` fixture runs it on every path this CPU has."""
    return simd


def encode(w: np.ndarray, dtype: int):
    """(raw bytes, float32 values the kernel should see) for a float matrix stored as dtype."""
    if dtype == F32:
        return w.astype(np.float32).view(np.uint8).reshape(-1), w.astype(np.float32)
    if dtype == F16:
        h = w.astype(np.float16)
        return h.view(np.uint8).reshape(-1), h.astype(np.float32)
    bits = (w.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # truncation is fine here
    return bits.view(np.uint8).reshape(-1), (bits.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 7, 33])
@pytest.mark.parametrize("K", [64, 200, 1000])
def test_matmul(path, dtype, M, K):
    N = 37
    w = rng.standard_normal((N, K)).astype(np.float32)
    raw, wf = encode(w, dtype)
    x = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    y = np.empty((M, N), np.float32)
    _ops.matmul(raw, dtype, N, K, x, y, b)
    ref = x.astype(np.float64) @ wf.T.astype(np.float64) + b
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-4 * np.sqrt(K))
    _ops.matmul(raw, dtype, N, K, x, y)
    np.testing.assert_allclose(y, ref - b, rtol=1e-5, atol=1e-4 * np.sqrt(K))


def test_matmul_rejects_bad_shapes():
    raw, _ = encode(np.ones((4, 8), np.float32), F32)
    with pytest.raises(ValueError):
        _ops.matmul(raw, F32, 4, 8, np.ones((2, 7), np.float32), np.empty((2, 4), np.float32))
    with pytest.raises(ValueError):
        _ops.matmul(raw[:-4], F32, 4, 8, np.ones((2, 8), np.float32), np.empty((2, 4), np.float32))
    with pytest.raises(ValueError):
        _ops.matmul(raw, 99, 4, 8, np.ones((2, 8), np.float32), np.empty((2, 4), np.float32))


def test_rmsnorm(path):
    x = (rng.standard_normal((5, 96)) * 3).astype(np.float32)
    w = rng.uniform(0.5, 1.5, 96).astype(np.float32)
    out = np.empty_like(x)
    _ops.rmsnorm(x, w, 1e-6, out)
    xd = x.astype(np.float64)
    ref = w * (xd / np.sqrt((xd ** 2).mean(-1, keepdims=True) + 1e-6))
    np.testing.assert_allclose(out, ref, rtol=2e-6, atol=1e-6)
    _ops.rmsnorm(x, w, 1e-6, x)  # in place
    np.testing.assert_allclose(x, out)


def rope_reference(x, pos, inv_freq):
    hd = x.shape[-1]
    ang = (pos[:, None].astype(np.float32) * inv_freq[None, :]).astype(np.float64)
    cos = np.concatenate([np.cos(ang), np.cos(ang)], -1)[:, None, :]
    sin = np.concatenate([np.sin(ang), np.sin(ang)], -1)[:, None, :]
    rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)  # rotate_half
    return x * cos + rot * sin


@pytest.mark.parametrize("act", [0, 8, 16], ids=["f32", "int8", "int16"])
@pytest.mark.parametrize("M", [1, 3, 4, 6])
def test_matmul_group_equals_separate_products(path, act, M):
    """q/k/v-style group products (mixed weight types, with and without bias) give, bit for bit,
    what one matmul per matrix gives, on both paths and in every activation mode."""
    from qwenc import _quant
    K = 256
    x = rng.standard_normal((M, K)).astype(np.float32)
    q8 = _quant.quantize_q8_0(rng.standard_normal((40, K)).astype(np.float32)).reshape(-1)
    f32_raw, _ = encode(rng.standard_normal((24, K)).astype(np.float32), F32)
    bf_raw, _ = encode(rng.standard_normal((8, K)).astype(np.float32), BF16)
    q8b = _quant.quantize_q8_0(rng.standard_normal((72, K)).astype(np.float32)).reshape(-1)
    mats = [(q8, 8, 40, rng.standard_normal(40).astype(np.float32)), (f32_raw, F32, 24, None),
            (bf_raw, BF16, 8, rng.standard_normal(8).astype(np.float32)), (q8b, 8, 72, None)]
    for count in (1, 2, 3, 4):
        group = mats[:count]
        outs = [np.full((M, n), np.nan, np.float32) for _, _, n, _ in group]
        _ops.matmul_group([(w, dt, n, o, b) for (w, dt, n, b), o in zip(group, outs)], x, act)
        for (w, dt, n, b), o in zip(group, outs):
            want = np.empty((M, n), np.float32)
            _ops.matmul(w, dt, n, K, x, want, b, act)
            np.testing.assert_array_equal(o, want)


def test_matmul_group_rejects_bad_groups():
    K = 64
    x = np.zeros((1, K), np.float32)
    w, _ = encode(np.zeros((4, K), np.float32), F32)
    y = np.empty((1, 4), np.float32)
    with pytest.raises(ValueError, match="group"):
        _ops.matmul_group([], x)
    with pytest.raises(ValueError, match="group"):
        _ops.matmul_group([(w, F32, 4, y, None)] * 5, x)
    with pytest.raises(ValueError, match="too small"):
        _ops.matmul_group([(w, F32, 4, y, None), (w[:-4], F32, 4, y, None)], x)
    with pytest.raises(ValueError, match="shape"):
        _ops.matmul_group([(w, F32, 4, np.empty((2, 4), np.float32), None)], x)
    with pytest.raises(ValueError, match="activation"):
        _ops.matmul_group([(w, F32, 4, y, None)], x, 5)


@pytest.mark.parametrize("hd", [16, 64, 128])
def test_rope_split_half_any_position(path, hd):
    theta = 1e6
    inv_freq = (1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float32) / hd)).astype(np.float32)
    x = rng.standard_normal((6, 3, hd)).astype(np.float32)
    pos = np.array([0, 1, 7, 100, 4095, 32767], dtype=np.int64)
    ref = rope_reference(x.astype(np.float64), pos, inv_freq)
    scaled = x.copy()
    _ops.rope(x, pos, inv_freq)
    np.testing.assert_allclose(x, ref, atol=2e-6)
    _ops.rope(scaled, pos, inv_freq, 1.25)  # YaRN's cos/sin scale
    np.testing.assert_allclose(scaled, 1.25 * ref, atol=3e-6)


def test_silu_mul_and_softmax(path):
    # ordinary values, the saturated tails (|g| past the exp clamp), zeros and tiny values, in a
    # length that is not a multiple of 8; then one long enough for the threaded path
    extremes = np.array([0.0, -0.0, 1e-30, -1e-30, 20, -20, 87.5, -87.5, 88.5, -88.5, 100, -100, 1e4, -1e4],
                        np.float32)
    for n in (1003, 70001):
        g = np.concatenate([extremes, rng.standard_normal(n - len(extremes)).astype(np.float32) * 8])
        u = rng.standard_normal(n).astype(np.float32)
        out = np.empty_like(g)
        _ops.silu_mul(g, u, out)
        g64 = g.astype(np.float64)
        with np.errstate(over="ignore"):
            want = g64 / (1 + np.exp(-g64)) * u
        np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-30)
    x = np.array([[1000.0, 999.0, -1000.0], [0.0, 0.0, 0.0]], np.float32)  # exp(1000) overflows
    _ops.softmax(x)
    e = np.exp(np.array([0.0, -1.0, -2000.0]))
    np.testing.assert_allclose(x[0], e / e.sum(), rtol=1e-6)
    np.testing.assert_allclose(x[1], [1 / 3] * 3, rtol=1e-6)


def attention_reference(q, K, V, start, scale):
    T, H, hd = q.shape
    Hkv = K.shape[0]
    out = np.zeros_like(q, dtype=np.float64)
    for t in range(T):
        n = start + t + 1
        for h in range(H):
            kvh = h // (H // Hkv)
            s = K[kvh, :n].astype(np.float64) @ q[t, h] * scale
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ V[kvh, :n]
    return out


def paged(seqs, bs, spare=3, dtype=np.float32):
    """Pools holding each (K, V) [Hkv, cap, hd] of `seqs` in blocks scattered in a random order
    (plus unused blocks): keys [Hkv, n_blocks, hd, bs] (transposed within a block), values
    [Hkv, n_blocks, bs, hd]; and the block tables [len(seqs), width]. Every slot no sequence
    holds is NaN, so a kernel that reads one (a key past the last in its block) shows it."""
    Hkv, _, hd = seqs[0][0].shape
    need = [-(-K.shape[1] // bs) for K, _ in seqs]
    order = rng.permutation(sum(need) + spare).astype(np.int32)
    Kc = np.full((Hkv, len(order), hd, bs), np.nan, dtype)
    Vc = np.full((Hkv, len(order), bs, hd), np.nan, dtype)
    tables = np.full((len(seqs), max(need)), -1, np.int32)
    at = 0
    for s, (K, V) in enumerate(seqs):
        for b in range(need[s]):
            blk = order[at]
            at += 1
            tables[s, b] = blk
            part = slice(b * bs, min((b + 1) * bs, K.shape[1]))
            n = part.stop - part.start
            Kc[:, blk, :, :n] = K[:, part].transpose(0, 2, 1)
            Vc[:, blk, :n] = V[:, part]
    tables[tables < 0] = 0
    return Kc, Vc, tables


def run_paged(q, K, V, start, scale, bs=16, dtype=np.float32):
    Kc, Vc, tables = paged([(K, V)], bs, dtype=dtype)
    T = q.shape[0]
    out = np.empty_like(q)
    _ops.paged_attention(q, Kc, Vc, tables, np.zeros(T, np.int32), np.arange(start, start + T, dtype=np.int64),
                         scale, out)
    return out


@pytest.mark.parametrize("H,Hkv", [(4, 4), (4, 2), (6, 2), (8, 1), (14, 2), (20, 2), (12, 1), (16, 1), (17, 1)])
@pytest.mark.parametrize("T,start", [(1, 0), (1, 9), (5, 0), (4, 6)])
def test_attention_gqa_causal(path, H, Hkv, T, start):
    hd, cap = 32, 16
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    K = (rng.standard_normal((Hkv, cap, hd)) * 3).astype(np.float32)
    V = rng.standard_normal((Hkv, cap, hd)).astype(np.float32)
    for bs in (1, 5, 16):
        out = run_paged(q, K, V, start, hd ** -0.5, bs)
        np.testing.assert_allclose(out, attention_reference(q, K, V, start, hd ** -0.5), atol=2e-5)


@pytest.mark.parametrize("hd", [8, 12, 64, 80, 128, 256])
@pytest.mark.parametrize("T,start", [(1, 0), (1, 3), (1, 300), (7, 0), (13, 290)])
def test_attention_head_dims_and_lengths(path, hd, T, start):
    """Head sizes that are and are not multiples of 8 (the AVX2 kernel takes 64 output columns
    at a time, keys 4 and exponentials 8 at a time), contexts not a multiple of either, and a
    peaked softmax whose max arrives in a later block than the first."""
    H, Hkv, cap = 6, 2, 320
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    K = (rng.standard_normal((Hkv, cap, hd)) * 2).astype(np.float32)
    V = rng.standard_normal((Hkv, cap, hd)).astype(np.float32)
    K[:, start // 2] *= 20  # one key far above the others: a peaked softmax, tiny weights elsewhere
    out = run_paged(q, K, V, start, hd ** -0.5)
    np.testing.assert_allclose(out, attention_reference(q, K, V, start, hd ** -0.5), atol=3e-5)


def test_attention_many_sequences_one_call(path):
    """Rows of several sequences of different lengths in one call, each through its own block
    table; each row's result is bit-identical to the row computed alone (batch invariance)."""
    H, Hkv, hd, bs = 6, 2, 64, 16
    lens = [1, 17, 40, 5, 33]
    seqs = [((rng.standard_normal((Hkv, n, hd)) * 2).astype(np.float32),
             rng.standard_normal((Hkv, n, hd)).astype(np.float32)) for n in lens]
    Kc, Vc, tables = paged(seqs, bs)
    # every sequence's last 1..3 positions as query rows, interleaved
    rows = [(s, p) for s, n in enumerate(lens) for p in range(max(0, n - 3), n)]
    rng.shuffle(rows)
    q = rng.standard_normal((len(rows), H, hd)).astype(np.float32)
    row_seq = np.array([s for s, _ in rows], np.int32)
    row_pos = np.array([p for _, p in rows], np.int64)
    out = np.empty_like(q)
    _ops.paged_attention(q, Kc, Vc, tables, row_seq, row_pos, hd ** -0.5, out)
    for t, (s, p) in enumerate(rows):
        K, V = seqs[s]
        want = attention_reference(q[t:t + 1], K, V, p, hd ** -0.5)
        np.testing.assert_allclose(out[t:t + 1], want, atol=3e-5)
        alone = np.empty_like(q[t:t + 1])
        _ops.paged_attention(q[t:t + 1], Kc, Vc, tables[s:s + 1], np.zeros(1, np.int32), row_pos[t:t + 1],
                             hd ** -0.5, alone)
        np.testing.assert_array_equal(alone, out[t:t + 1])


@contextlib.contextmanager
def threads(n):
    old = _ops.get_threads()
    _ops.set_threads(n)
    try:
        yield
    finally:
        _ops.set_threads(old)


@pytest.mark.parametrize("bs", [16, 5, 1])
@pytest.mark.parametrize("Hkv,f16", [(2, False), (1, True)])
def test_attention_long_rows_in_spans(path, bs, Hkv, f16):
    """Rows past 1,024 positions are attended in spans (as separate work items when the call has
    few rows, one after another when it has many) whose states merge in order: each row agrees
    with the float64 reference, with its max in a later span than the first, at the span edges
    (1,023 and 1,024: one position in a second span), and gives the same bits alone, among many
    rows, and at 1 or 2 threads."""
    H, hd, cap = 4 * Hkv, 64, 2600
    K = (rng.standard_normal((Hkv, cap, hd)) * 2).astype(np.float32)
    V = rng.standard_normal((Hkv, cap, hd)).astype(np.float32)
    K[:, 2100] *= 25  # a peaked softmax whose max lies in the third span
    if f16:
        K, V = K.astype(np.float16).astype(np.float32), V.astype(np.float16).astype(np.float32)
    Kc, Vc, tables = paged([(K, V)], bs, dtype=np.float16 if f16 else np.float32)
    pos = np.array([2599, 1023, 1024, 2100, 700, 2047, 2048, 3, 2300, 1500], np.int64)
    q = rng.standard_normal((len(pos), H, hd)).astype(np.float32)
    zeros = np.zeros(len(pos), np.int32)
    many = np.empty_like(q)
    with threads(2):
        _ops.paged_attention(q, Kc, Vc, tables, zeros, pos, hd ** -0.5, many)
    for t, p in enumerate(pos):
        np.testing.assert_allclose(many[t:t + 1], attention_reference(q[t:t + 1], K, V, p, hd ** -0.5), atol=3e-5)
        for n in (1, 2):
            alone = np.empty_like(q[t:t + 1])
            with threads(n):
                _ops.paged_attention(q[t:t + 1], Kc, Vc, tables, zeros[:1], pos[t:t + 1], hd ** -0.5, alone)
            np.testing.assert_array_equal(alone, many[t:t + 1])


def test_attention_spans_falsifier():
    """The span test's reference sees a merge that drops a span's rescaling: the last span's
    state taken as the whole answer is far off for a row whose max is in an earlier span."""
    H, Hkv, hd, cap = 2, 1, 64, 1800
    K = (rng.standard_normal((Hkv, cap, hd)) * 2).astype(np.float32)
    V = rng.standard_normal((Hkv, cap, hd)).astype(np.float32)
    K[:, 100] *= 25
    q = rng.standard_normal((1, H, hd)).astype(np.float32)
    want = attention_reference(q, K, V, 1799, hd ** -0.5)
    last_span = attention_reference(q, K[:, 1024:], V[:, 1024:], 1799 - 1024, hd ** -0.5)
    assert np.abs(last_span - want).max() > 1e-2
    np.testing.assert_allclose(run_paged(q, K, V, 1799, hd ** -0.5), want, atol=3e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_kv_write_places_rows_in_their_slots(path, dtype):
    Hkv, hd, bs = 2, 12, 4  # hd not a multiple of 8: the vector converters' scalar tail
    Kc = np.zeros((Hkv, 5, hd, bs), dtype)
    Vc = np.zeros((Hkv, 5, bs, hd), dtype)
    k = rng.standard_normal((3, Hkv, hd)).astype(np.float32)
    v = rng.standard_normal((3, Hkv, hd)).astype(np.float32)
    slots = np.array([2 * bs + 1, 4 * bs + 3, 0], np.int64)
    _ops.kv_write(k, v, slots, Kc, Vc)
    for t, sl in enumerate(slots):
        np.testing.assert_array_equal(Kc[:, sl // bs, :, sl % bs], k[t].astype(dtype))
        np.testing.assert_array_equal(Vc[:, sl // bs, sl % bs], v[t].astype(dtype))
    assert np.count_nonzero(Kc) == k.size
    with pytest.raises(ValueError):
        _ops.kv_write(k, v, np.array([0, 1, 5 * bs], np.int64), Kc, Vc)
    with pytest.raises(ValueError):  # the values' pool in the keys' layout
        _ops.kv_write(k, v, slots, Kc, Kc.copy())
    with pytest.raises(ValueError):  # pools of two dtypes
        _ops.kv_write(k, v, slots, Kc, Vc.astype(np.float32 if dtype == np.float16 else np.float16))


def _f16_cases():
    """float32 values whose rounding to half precision is easy to get wrong: ties at every
    scale, the subnormal range and its edges, the overflow edge, signed zeros and infinities,
    and a spread of ordinary values."""
    bits = np.arange(0, 1 << 16, dtype=np.uint32)
    halves = bits.astype(np.uint16).view(np.float16)
    finite = halves[np.isfinite(halves)].astype(np.float32)
    nxt = np.nextafter(finite, np.float32(np.inf)).astype(np.float32)
    mids = ((finite.astype(np.float64) + np.roll(finite, -1).astype(np.float64)) / 2).astype(np.float32)
    edges = np.array([65504, 65519.996, 65520, 65536, 1e6, 2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0000001,
                      2.0 ** -26, 2.0 ** -14, 2.0 ** -14 * (1 - 2.0 ** -12), 1e-30, 0.0, -0.0, np.inf, -np.inf],
                     np.float32)
    spread = (rng.standard_normal(20000) * np.exp(rng.uniform(-20, 12, 20000))).astype(np.float32)
    x = np.concatenate([finite, nxt, mids, -mids, edges, spread]).astype(np.float32)
    return x[np.isfinite(x) | np.isinf(x)]


def test_f16_storage_rounds_as_numpy_does(path):
    """Keys and values written to a float16 pool are numpy's float32 -> float16 conversion
    (round to nearest even) bit for bit, on the plain and the F16C path alike."""
    x = _f16_cases()
    hd, bs = 8, 16
    T = -(-len(x) // hd)
    vals = np.zeros(T * hd, np.float32)
    vals[:len(x)] = x
    k = vals.reshape(T, 1, hd)
    nb = -(-T // bs)
    Kc = np.zeros((1, nb, hd, bs), np.float16)
    Vc = np.zeros((1, nb, bs, hd), np.float16)
    _ops.kv_write(k, k, np.arange(T, dtype=np.int64), Kc, Vc)
    got = Vc.reshape(-1, hd)[:T].reshape(-1)[:len(x)]
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    gotk = Kc.transpose(1, 3, 0, 2).reshape(-1, hd)[:T].reshape(-1)[:len(x)]
    np.testing.assert_array_equal(gotk.view(np.uint16), want.view(np.uint16))
    nan = np.full((1, 1, hd), np.nan, np.float32)
    _ops.kv_write(nan, nan, np.array([0], np.int64), Kc, Vc)
    assert np.isnan(Vc[0, 0, 0]).all() and np.isnan(Kc[0, 0, :, 0]).all()


@pytest.mark.parametrize("hd", [8, 12, 64, 128])
@pytest.mark.parametrize("T,start", [(1, 0), (1, 300), (9, 40)])
def test_attention_f16_pool(path, hd, T, start):
    """A float16 pool gives the attention of its rounded keys and values, computed in float32
    (plain and AVX2 paths read it; the keys' last block is partial)."""
    H, Hkv, cap = 14, 2, 320
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    K = (rng.standard_normal((Hkv, cap, hd)) * 2).astype(np.float16).astype(np.float32)
    V = rng.standard_normal((Hkv, cap, hd)).astype(np.float16).astype(np.float32)
    for bs in (5, 16):
        out = run_paged(q, K, V, start, hd ** -0.5, bs, dtype=np.float16)
        np.testing.assert_allclose(out, attention_reference(q, K, V, start, hd ** -0.5), atol=3e-5)
        f32 = run_paged(q, K, V, start, hd ** -0.5, bs)
        np.testing.assert_allclose(out, f32, atol=1e-6)  # the same values in float32: the same sums


def test_attention_large_scores_do_not_overflow(path):
    q = np.full((1, 1, 8), 30.0, np.float32)
    K = np.full((1, 4, 8), 30.0, np.float32)
    K[0, 2] = 31.0
    V = np.arange(32, dtype=np.float32).reshape(1, 4, 8)
    out = run_paged(q, K, V, 3, 1.0)  # scores ~7200: exp overflows without the max
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out[0, 0], V[0, 2])


def test_attention_rejects_positions_beyond_the_table():
    q = np.zeros((2, 2, 8), np.float32)
    Kc = np.zeros((1, 2, 8, 4), np.float32)
    Vc = np.zeros((1, 2, 4, 8), np.float32)
    tables = np.array([[0, 1]], np.int32)
    _ops.paged_attention(q, Kc, Vc, tables, np.zeros(2, np.int32), np.array([6, 7], np.int64), 1.0,
                         np.empty_like(q))  # within bounds: accepted
    with pytest.raises(ValueError):  # position 8 needs a third block
        _ops.paged_attention(q, Kc, Vc, tables, np.zeros(2, np.int32), np.array([7, 8], np.int64), 1.0,
                             np.empty_like(q))
    with pytest.raises(ValueError):  # block id outside the pool
        _ops.paged_attention(q, Kc, Vc, np.array([[0, 2]], np.int32), np.zeros(2, np.int32),
                             np.array([6, 7], np.int64), 1.0, np.empty_like(q))
    with pytest.raises(ValueError):  # sequence row outside the tables
        _ops.paged_attention(q, Kc, Vc, tables, np.array([0, 1], np.int32), np.array([1, 2], np.int64), 1.0,
                             np.empty_like(q))
    with pytest.raises(ValueError):  # keys in the values' layout
        _ops.paged_attention(q, Vc, Vc, tables, np.zeros(2, np.int32), np.array([6, 7], np.int64), 1.0,
                             np.empty_like(q))
    with pytest.raises(ValueError):  # a pool of another dtype
        _ops.paged_attention(q, Kc.astype(np.float64), Vc, tables, np.zeros(2, np.int32),
                             np.array([6, 7], np.int64), 1.0, np.empty_like(q))


def test_embed(path):
    V, D = 50, 24
    table = rng.standard_normal((V, D)).astype(np.float32)
    for dtype in (F32, F16, BF16):
        raw, tf = encode(table, dtype)
        ids = np.array([0, 49, 7, 7], np.int32)
        out = np.empty((4, D), np.float32)
        _ops.embed(raw, dtype, V, D, ids, out)
        np.testing.assert_array_equal(out, tf[ids])
    with pytest.raises(ValueError):
        _ops.embed(raw, BF16, V, D, np.array([50], np.int32), np.empty((1, D), np.float32))


@pytest.mark.parametrize("dtype", [10, 11, 16, 23, 99])  # Q2_K, Q3_K, IQ2_XXS, IQ4_XS, unknown
def test_embed_refuses_types_without_a_kernel(dtype):
    """It used to write zeros, which the model then ran on as if they were embeddings."""
    out = np.full((1, 256), 7.0, np.float32)
    with pytest.raises(ValueError, match="unsupported embedding type"):
        _ops.embed(np.zeros(4096, np.uint8), dtype, 2, 256, np.array([1], np.int32), out)
    assert (out == 7.0).all()


def test_embed_refuses_a_row_length_off_the_block():
    from qwenc.formats.tensors import Q8_0
    with pytest.raises(ValueError, match="block size"):
        _ops.embed(np.zeros(4096, np.uint8), Q8_0, 2, 48, np.array([1], np.int32), np.empty((1, 48), np.float32))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("n", [1, 3, 4, 5, 1023, 100003])
def test_read_sum_is_the_wrapping_word_sum(n, threads):
    """The bandwidth probe's read really reads every word (its sum is checked against numpy's),
    whatever the thread count and however the words split among the threads."""
    words = rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False)
    prev = _ops.get_threads()
    _ops.set_threads(threads)
    try:
        got = _ops.read_sum(words)
    finally:
        _ops.set_threads(prev)
    assert got == int(words.sum(dtype=np.uint64))
    words[n // 2] ^= np.uint64(1)  # falsifier: one changed bit changes the sum
    assert _ops.read_sum(words) != got


@contextlib.contextmanager
def probe_paths(threads):
    """With `threads` kernel threads, an iterator that sets each SIMD path this CPU has in turn
    (the probes' tests run every path); the thread count and path are restored on leaving, also
    when a test fails."""
    prev_threads, prev_path = _ops.get_threads(), _ops.simd_path()

    def paths():
        for path in _ops.simd_paths():
            _ops.set_simd_path(path)
            yield path

    try:
        _ops.set_threads(threads)
        yield paths()
    finally:
        _ops.set_threads(prev_threads)
        _ops.set_simd_path(prev_path)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("rounds", [0, 9, 64, 1001])
def test_dot_peak_does_the_products_it_counts(rounds, threads):
    """The integer peak probe (probe.h) on every path this CPU has: its result is the sum of its
    accumulators' lanes, each product adding 1, so it equals the products the path claims per
    round (24 chains of one instruction: 64 byte products for 512-bit vpdpbusd, 32 for the
    256-bit paths and plain C) on every thread only if each chain's every product was done and
    summed."""
    done = max(8, rounds) // 8 * 8
    with probe_paths(threads) as paths:
        for path in paths:
            per_round = 24 * (64 if path in ("avx512w", "amx", "amxbf16") else 32)
            assert _ops.dot_peak(rounds) == threads * done * per_round, path
    with pytest.raises(ValueError):
        _ops.dot_peak(-1)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("fp", [0, 1, 3, 8])
def test_dot_peak_mix_does_the_products_it_counts(fp, threads):
    """The mixed probe (probe.h: 16 chains of 512-bit vpdpbusd with fp float FMAs among them) on
    every path this CPU has: on a 512-bit path its count is 16 x 64 byte products per round on
    every thread, whatever the float work (also past a segment and the summed lanes' 32-bit
    wrap); every other path, and fp outside 0..8, is refused with a ValueError."""
    with probe_paths(threads) as paths:
        for path in paths:
            if path in ("avx512w", "amx", "amxbf16"):
                assert _ops.dot_peak_mix(1001, fp) == threads * 1000 * 16 * 64, path
                rounds = (1 << 22) + 8
                assert _ops.dot_peak_mix(rounds, fp) == threads * rounds * 16 * 64, path
                for bad in (-1, 9):
                    with pytest.raises(ValueError):
                        _ops.dot_peak_mix(8, bad)
            else:
                with pytest.raises(ValueError):
                    _ops.dot_peak_mix(8, fp)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rounds", [0, 9, 1001, (1 << 21) + 8])
def test_dot_peak_words_does_the_products_it_counts(rounds, threads):
    """The 16-bit probe (probe.h: 24 vpmaddwd a round, each with its add, in register chains) on
    every path this CPU has: 24 x 16 multiply-adds a round on every thread (also past a segment),
    so every chain's every product was done and summed; the plain path, which has no vpmaddwd,
    is refused with a ValueError."""
    done = max(8, rounds) // 8 * 8
    with probe_paths(threads) as paths:
        for path in paths:
            if path == "plain":
                with pytest.raises(ValueError):
                    _ops.dot_peak_words(rounds)
            else:
                assert _ops.dot_peak_words(rounds) == threads * done * 24 * 16, path
    with pytest.raises(ValueError):
        _ops.dot_peak_words(-1)


def test_dot_peak_counts_long_runs_without_wrapping():
    """A run long enough for `qwenc bench` (0.2 s: beyond 44 million rounds on an AVX-512 core) would
    wrap the probe's 32-bit lanes; it is counted in segments, so the count stays exact. Before,
    `qwenc bench` reported a peak of 9-36 G/s where the probe does over 700."""
    prev = _ops.get_threads()
    try:
        _ops.set_threads(1)
        rounds = (1 << 26) + 8 * 3  # past the wrap, and not a whole number of segments
        per_round = 24 * (64 if _ops.simd_path() in ("avx512w", "amx", "amxbf16") else 32)
        assert _ops.dot_peak(rounds) == rounds * per_round
    finally:
        _ops.set_threads(prev)


@pytest.mark.parametrize("H,Hkv,hd", [(14, 2, 64), (8, 1, 16), (16, 1, 24), (17, 1, 8), (12, 2, 128)])
@pytest.mark.parametrize("f16", [False, True])
@pytest.mark.parametrize("start", [70, 2060])
def test_attention_simd_paths_give_the_same_bits(H, Hkv, hd, f16, start):
    """The AVX-512 attention (tiles of up to 8 heads) computes every score and output with the
    AVX2 path's FMA chains, so the two agree bit for bit, in one span or several; on a CPU
    without AVX-512 this compares AVX2 with itself. A mutation of either path's arithmetic shows
    here."""
    simd = [p for p in _ops.simd_paths() if p != "plain"]
    T, cap = 3, start + 26
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    K = rng.standard_normal((Hkv, cap, hd)).astype(np.float32)
    V = rng.standard_normal((Hkv, cap, hd)).astype(np.float32)
    outs = []
    for p in simd:
        old = _ops.set_simd_path(p)
        try:
            outs.append(run_paged(q, K, V, start, hd ** -0.5, 16, dtype=np.float16 if f16 else np.float32))
        finally:
            _ops.set_simd_path(old)
    for o in outs[1:]:
        np.testing.assert_array_equal(o.view(np.uint32), outs[0].view(np.uint32))
