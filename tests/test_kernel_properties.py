"""Property tests of the kernels in csrc/ops.c, csrc/sample.c and csrc/bpe.c on sizes chosen to
break them: 0 and 1 rows, lengths that are not multiples of the SIMD width (8) or of the chunk
sizes (silu_mul's 4096, the 65,536-element threading threshold), each on the AVX2 and the plain
C path, against numpy references. `make test-asan` runs them on the sanitized build, where a read
or write past a buffer fails the run."""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qwenc import _ops

CI = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")
SETTINGS = settings(max_examples=60, deadline=None, derandomize=CI, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Lengths around every boundary the kernels have.
ODD = [1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 65, 255, 257, 4095, 4096, 4097, 8193]
lengths = st.sampled_from(ODD) | st.integers(1, 300)


@pytest.fixture(params=["simd", "plain"])
def path(request):
    if request.param == "simd" and not _ops.has_avx2():
        pytest.skip("CPU without AVX2/FMA/F16C")
    old = _ops.set_simd(request.param == "simd")
    yield request.param
    _ops.set_simd(old)


def _floats(draw_seed, shape, scale=3.0):
    return (np.random.default_rng(draw_seed).standard_normal(shape) * scale).astype(np.float32)


def _guarded(shape, dtype=np.float32):
    """An array inside a larger one filled with a sentinel: writes past its ends show up."""
    n = int(np.prod(shape))
    buf = np.full(n + 32, 1234.5, dtype)
    return buf, buf[16:16 + n].reshape(shape)


def _untouched(buf, n):
    return (buf[:16] == 1234.5).all() and (buf[16 + n:] == 1234.5).all()


@SETTINGS
@given(M=st.sampled_from([0, 1, 2, 3, 5]), D=lengths, seed=st.integers(0, 2**32 - 1))
def test_rmsnorm_odd_sizes(path, M, D, seed):
    x = _floats(seed, (M, D))
    w = np.abs(_floats(seed + 1, D)) + 0.5
    buf, out = _guarded((M, D))
    _ops.rmsnorm(x, w, 1e-6, out)
    assert _untouched(buf, M * D)
    xd = x.astype(np.float64)
    ref = w * (xd / np.sqrt((xd ** 2).mean(-1, keepdims=True) + 1e-6)) if M else xd
    np.testing.assert_allclose(out, ref, rtol=3e-6, atol=1e-6)


@SETTINGS
@given(n=lengths | st.sampled_from([65535, 65536, 65537, 70001]), seed=st.integers(0, 2**32 - 1))
def test_silu_mul_odd_lengths(path, n, seed):
    g, u = _floats(seed, n, 8.0), _floats(seed + 1, n)
    buf, out = _guarded((n,))
    _ops.silu_mul(g, u, out)
    assert _untouched(buf, n)
    gd = g.astype(np.float64)
    np.testing.assert_allclose(out, gd / (1 + np.exp(-gd)) * u, rtol=2e-5, atol=1e-6)


@SETTINGS
@given(M=st.sampled_from([1, 2, 5]), n=lengths, seed=st.integers(0, 2**32 - 1))
def test_softmax_odd_sizes(path, M, n, seed):
    x = _floats(seed, (M, n), 20.0)
    ref = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    buf, y = _guarded((M, n))
    y[...] = x
    _ops.softmax(y)
    assert _untouched(buf, M * n)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-7)


@SETTINGS
@given(T=st.sampled_from([0, 1, 2, 7]), H=st.sampled_from([1, 2, 3, 5]), half=st.integers(1, 70),
       seed=st.integers(0, 2**32 - 1))
def test_rope_odd_sizes(path, T, H, half, seed):
    hd = 2 * half
    inv_freq = (1.0 / 1e4 ** (np.arange(0, hd, 2, dtype=np.float32) / hd)).astype(np.float32)
    x = _floats(seed, (T, H, hd))
    pos = np.random.default_rng(seed).integers(0, 40000, T).astype(np.int64)
    ang = (pos[:, None].astype(np.float32) * inv_freq[None, :]).astype(np.float64)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :half].astype(np.float64), x[..., half:].astype(np.float64)
    ref = np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)
    _ops.rope(x, pos, inv_freq)
    np.testing.assert_allclose(x, ref, atol=3e-6)


@SETTINGS
@given(V=st.integers(1, 70), D=st.sampled_from([1, 3, 8, 17, 64]), T=st.sampled_from([0, 1, 2, 9]),
       dtype=st.sampled_from([0, 1, 30]), seed=st.integers(0, 2**32 - 1))
def test_embed_odd_sizes(path, V, D, T, dtype, seed):
    table = _floats(seed, (V, D))
    if dtype == 0:
        raw, want = table.view(np.uint8).reshape(-1), table
    elif dtype == 1:
        h = table.astype(np.float16)
        raw, want = h.view(np.uint8).reshape(-1), h.astype(np.float32)
    else:
        bits = (table.view(np.uint32) >> 16).astype(np.uint16)
        raw, want = bits.view(np.uint8).reshape(-1), (bits.astype(np.uint32) << 16).view(np.float32)
    ids = np.random.default_rng(seed).integers(0, V, T).astype(np.int32)
    buf, out = _guarded((T, D))
    _ops.embed(np.ascontiguousarray(raw), dtype, V, D, ids, out)
    assert _untouched(buf, T * D)
    np.testing.assert_array_equal(out, want[ids])


# ---------------------------------------------------------------- sampling

def _support(logits, temperature, top_k, top_p, min_p):
    """The token ids transformers' warpers keep (temperature, top-k, top-p, min-p), in float64."""
    z = logits.astype(np.float64) / temperature
    keep = np.ones(len(z), bool)
    if 0 < top_k < len(z):
        keep &= z >= np.sort(z)[-top_k]
    p = np.where(keep, np.exp(z - z.max()), 0)
    p /= p.sum()
    if top_p < 1:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        drop = np.zeros(len(z), bool)
        drop[order[1:]] = cum[:-1] >= top_p
        keep &= ~drop
    if min_p > 0:
        keep &= p >= min_p * p.max()
    return keep


@SETTINGS
@given(n=lengths, seed=st.integers(0, 2**32 - 1), temperature=st.sampled_from([0.3, 0.7, 1.0, 2.5]),
       top_k=st.sampled_from([0, 1, 2, 5, 50, 10**6]), top_p=st.sampled_from([1.0, 0.95, 0.6, 0.1]),
       min_p=st.sampled_from([0.0, 0.05, 0.5]), u=st.floats(0, 1, exclude_max=True))
def test_sample_draws_from_the_support(n, seed, temperature, top_k, top_p, min_p, u):
    logits = _floats(seed, n, 4.0)
    keep = _support(logits, temperature, top_k, top_p, min_p)
    idx, val = np.full(n + 8, -9, np.int32), np.empty(n + 8, np.float32)
    token = _ops.sample(logits.copy(), temperature, min(top_k, n), top_p, min_p, u, idx[:n], val[:n])
    assert (idx[n:] == -9).all(), "wrote past its scratch"
    assert 0 <= token < n
    # a token outside the support is allowed only at a float32 rounding tie of the boundary
    assert keep[token] or np.isclose(np.sort(logits)[-max(1, keep.sum())], logits[token], rtol=1e-5)


@SETTINGS
@given(n=lengths, seed=st.integers(0, 2**32 - 1))
def test_argmax_and_greedy(n, seed):
    x = _floats(seed, n)
    x[np.random.default_rng(seed).integers(0, n)] = x.max()  # a tie: the first maximum wins
    first = int(np.argmax(x))
    assert _ops.argmax(x) == first
    idx, val = np.empty(n, np.int32), np.empty(n, np.float32)
    assert _ops.sample(x.copy(), 0.0, 0, 1.0, 0.0, 0.5, idx, val) == first
    assert _ops.sample(x.copy(), 1.0, 1, 1.0, 0.0, 0.999, idx, val) == first


def _scan_argmax(x):
    """qw_argmax's definition: `if x[i] > x[best]: best = i` from best = 0 (a NaN never wins,
    unless it is x[0])."""
    if np.isnan(x[0]):
        return 0
    return int(np.flatnonzero(x == np.nanmax(x))[0])


def test_scan_argmax_reference_is_the_scan():
    rng = np.random.default_rng(5)
    for n in (1, 2, 9, 40):
        for _ in range(50):
            x = rng.choice(np.array([-np.inf, -1.0, -0.0, 0.0, 1.0, 2.0, np.nan], np.float32), n)
            best = 0
            for i in range(1, n):
                if x[i] > x[best]:
                    best = i
            assert _scan_argmax(x) == best, x


@pytest.mark.parametrize("n", [32767, 32768, 32769, 65537, 151936])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_argmax_long_rows_split_between_threads(path, n, threads):
    """Long rows are split between the threads: the same index as the scan over the whole row,
    ties across the shares' seams (the first wins), NaNs at their starts, whatever the count."""
    rng = np.random.default_rng(n + threads)
    prev = _ops.get_threads()
    _ops.set_threads(threads)
    try:
        seams = sorted({n * t // k for k in (2, 3) for t in range(1, k)})
        cases = []
        x = rng.standard_normal(n).astype(np.float32)
        cases.append(x.copy())
        x[[n - 1] + seams] = 9.0  # ties in every share: the first one wins
        cases.append(x.copy())
        x[seams] = np.nan  # a NaN where a share starts: its share's winner comes after it
        cases.append(x.copy())
        y = np.full(n, np.nan, np.float32)
        y[[0, n - 1]] = -np.inf, 3.0  # all NaN but two
        cases.append(y)
        z = np.full(n, -np.inf, np.float32)
        cases.append(z)
        w = np.full(n, -1.0, np.float32)
        w[n // 2] = -0.0
        w[n - 2] = 0.0  # -0 == +0: the first of them
        cases.append(w)
        v = rng.standard_normal(n).astype(np.float32)
        v[0] = np.nan  # the scan never leaves x[0]
        cases.append(v)
        for c in cases:
            assert _ops.argmax(c) == _scan_argmax(c)
    finally:
        _ops.set_threads(prev)


def test_sample_rejects_empty_and_short_scratch():
    with pytest.raises(ValueError):
        _ops.sample(np.zeros(0, np.float32), 1.0, 0, 1.0, 0.0, 0.5, np.empty(0, np.int32), np.empty(0, np.float32))
    with pytest.raises(ValueError):
        _ops.sample(np.zeros(8, np.float32), 1.0, 0, 1.0, 0.0, 0.5, np.empty(7, np.int32), np.empty(8, np.float32))
    with pytest.raises(ValueError):
        _ops.argmax(np.zeros(0, np.float32))


# ---------------------------------------------------------------- byte-level BPE

@pytest.fixture(scope="module")
def bpe():
    """A byte-level BPE over the 256 bytes and merges that build words of up to 70 bytes, so
    words cross the 64-byte word-cache limit."""
    from qwenc import _bpe
    from qwenc.text.tokenizer import _BYTE_CHAR
    tokens = list(_BYTE_CHAR)
    pairs = [("a", "b"), ("ab", "c"), ("abc", "d"), ("Ġ", "Ġ"), ("ĠĠ", "ĠĠ")]
    pairs += [("a" * k, "a" * k) for k in (1, 2, 4, 8, 16, 32)]  # up to a 64-byte token
    merges = [f"{a} {b}" for a, b in pairs]
    tokens += [a + b for a, b in pairs]
    n = len(tokens)
    m = _bpe.BPE("\n".join(tokens).encode(), n, b"\x01" * n, bytes([_bpe.KIND_PLAIN]) * n,
                 "\n".join(merges).encode(), len(merges))
    return m


@settings(max_examples=300, deadline=None, derandomize=CI, database=None)
@given(text=st.text(st.characters(blacklist_categories=["Cs"]), max_size=200)
       | st.sampled_from(["", "a" * 63, "a" * 64, "a" * 65, "a" * 129, " " * 70, "abcd" * 40, "\n\r\n" * 30]))
def test_bpe_roundtrip_and_tiling(bpe, text):
    raw = text.encode("utf-8")
    ids = bpe.encode(raw)
    assert len(ids) <= len(raw)
    assert bpe.decode_bytes(ids) == raw
    assert b"".join(bpe.pretokenize(raw)) == raw
    assert bpe.encode(raw) == ids  # the word cache gives what the merge loop gave


@settings(max_examples=200, deadline=None, derandomize=CI, database=None)
@given(raw=st.binary(max_size=200))
def test_bpe_any_bytes(bpe, raw):
    """Invalid UTF-8 (C callers may pass anything) is still read safely and round-trips."""
    assert bpe.decode_bytes(bpe.encode(raw)) == raw


def test_bpe_rejects_malformed_tables():
    from qwenc import _bpe
    from qwenc.text.tokenizer import _BYTE_CHAR
    blob = "\n".join(_BYTE_CHAR).encode()
    kinds = bytes([_bpe.KIND_PLAIN]) * 256
    with pytest.raises(ValueError, match="fewer"):
        _bpe.BPE(blob, 257, b"\x01" * 257, kinds + b"\x01", b"", 0)
    with pytest.raises(ValueError, match="more"):
        _bpe.BPE(blob + b"\nextra", 256, b"\x01" * 256, kinds, b"", 0)
    with pytest.raises(ValueError, match="byte"):
        _bpe.BPE(blob, 256, b"\x01" * 255 + b"\x00", kinds, b"", 0)
    with pytest.raises(ValueError, match="one space"):
        _bpe.BPE(blob, 256, b"\x01" * 256, kinds, b"a b c", 1)
    with pytest.raises(ValueError, match="missing"):
        _bpe.BPE(blob, 256, b"\x01" * 256, kinds, b"a b", 1)
    with pytest.raises(ValueError):
        _bpe.BPE(blob, 0, b"", b"", b"", 0)
    with pytest.raises(ValueError, match="one byte per token"):
        _bpe.BPE(blob, 256, b"\x01", kinds, b"", 0)
