"""Row kernels of every block-quantized type against the gguf package's reference (de)quantizers.

The oracle is `gguf.quants`: dequantize must agree bit for bit (the kernels evaluate the same
float32 formula in the same order), the fused dot must agree with a float64 dot of the reference
rows to float32 accuracy, on both the AVX2 and the plain C path, and the Q8_0 quantizer must
produce the same bytes. Data: real tensors of the demo model where it has the type, seeded random
blocks for all types. The falsifier tests at the end show these comparisons reject near misses.
"""
import os

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GT  # noqa: E402
from gguf.quants import dequantize as ref_dequantize  # noqa: E402
from gguf.quants import quantize as ref_quantize  # noqa: E402

from qwenc import _quant  # noqa: E402
from qwenc.formats.tensors import BLOCK, DTYPE_NAMES  # noqa: E402

BLOCK_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
CODE = {name: code for code, name in DTYPE_NAMES.items()}
INT8 = 8  # qwenc._ops.ACTIVATIONS["int8"], the code qw_matmul takes for 8-bit activations
# Types gguf's Python package can quantize (the k-quants it can only dequantize).
REF_QUANTIZABLE = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}
# Byte offsets of the f16 scale fields (d, and dmin / m where the type has one).
SCALE_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
                "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}

# |dot - exact| <= DOT_RTOL * sum|w_i x_i|: float32 accumulation over a few thousand terms stays
# within ~1e-6 of that bound; a single code off by one in a row breaks it (see the falsifier).
DOT_RTOL = 1e-5


def random_blocks(name, rows, cols, rng, scale_bits=None):
    """Stored bytes of a [rows, cols] tensor: random codes (every bit pattern is a valid block)
    with f16 scales drawn from +-[1e-4, 1e-2], or raw random bits when scale_bits is set."""
    elems, nbytes = BLOCK[CODE[name]]
    blocks = rng.integers(0, 256, size=(rows, cols // elems, nbytes), dtype=np.uint8)
    if scale_bits is None:
        for off in SCALE_FIELDS[name]:
            mag = np.exp(rng.uniform(np.log(1e-4), np.log(1e-2), size=blocks.shape[:2]))
            d = (mag * rng.choice([-1.0, 1.0], size=mag.shape)).astype(np.float16)
            blocks[..., off:off + 2] = d.view(np.uint8).reshape(blocks.shape[:2] + (2,))
    return blocks.reshape(rows, -1)


def synthetic(name, rows, cols, seed):
    """A tensor of type `name`: quantized by the reference from seeded normal data where it can,
    else random valid blocks."""
    rng = np.random.default_rng(seed)
    if name in REF_QUANTIZABLE:
        x = rng.standard_normal((rows, cols)).astype(np.float32) * rng.uniform(0.01, 2.0, (rows, 1)).astype(np.float32)
        return ref_quantize(x, GT[name])
    return random_blocks(name, rows, cols, rng)


def assert_same_bits(got, want):
    """Bit-for-bit equality of float32 arrays (NaNs equal to NaNs)."""
    assert got.shape == want.shape and got.dtype == want.dtype == np.float32
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    if not same.all():
        i = np.argwhere(~same)[0]
        raise AssertionError(f"{(~same).sum()} of {same.size} values differ; first at {tuple(i)}: "
                             f"{got[tuple(i)]!r} != {want[tuple(i)]!r}")


def assert_dot_close(got, rows_f32, x):
    """got[r] is the dot of rows_f32[r] with x to within DOT_RTOL of sum |w x|."""
    w = rows_f32.astype(np.float64)
    exact = w @ x.astype(np.float64)
    bound = DOT_RTOL * (np.abs(w) @ np.abs(x.astype(np.float64))) + 1e-30
    err = np.abs(got.astype(np.float64) - exact)
    bad = err > bound
    if bad.any():
        r = int(np.argmax(err / bound))
        raise AssertionError(f"{bad.sum()} of {len(got)} dots off: row {r} got {got[r]!r}, exact "
                             f"{exact[r]!r}, error {err[r]:.3g} > bound {bound[r]:.3g}")


def check_kernels(name, data, rows, cols, seed=0):
    """dequantize == reference bit for bit; dot_rows close to the exact dot of the reference rows."""
    want = ref_dequantize(data, GT[name]).reshape(rows, cols)
    got = _quant.dequantize(data, CODE[name], rows, cols)
    assert_same_bits(got, want)
    x = np.random.default_rng(seed).standard_normal(cols).astype(np.float32)
    assert_dot_close(_quant.dot_rows(data, CODE[name], rows, cols, x), want, x)


# ---------------------------------------------------------------- synthetic data, every type

@pytest.mark.parametrize("name", BLOCK_TYPES)
@pytest.mark.parametrize("cols", [256, 768, 4864])
def test_synthetic_matches_reference(name, cols, simd):
    rows = 9
    check_kernels(name, synthetic(name, rows, cols, seed=cols), rows, cols, seed=cols)


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_random_blocks_match_reference(name, simd):
    """Random bytes everywhere but the scales: every code bit pattern, in every position."""
    rows, cols = 16, 512
    check_kernels(name, random_blocks(name, rows, cols, np.random.default_rng(7)), rows, cols)


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_any_scale_bits_dequantize_exactly(name, simd):
    """Scales that are zero, subnormal, huge, infinite or NaN: still the reference's values."""
    rng = np.random.default_rng(11)
    rows, cols = 8, 512
    data = random_blocks(name, rows, cols, rng, scale_bits=True)
    elems, nbytes = BLOCK[CODE[name]]
    blocks = data.reshape(rows, -1, nbytes)
    specials = np.array([0x0000, 0x8000, 0x0001, 0x03FF, 0x7BFF, 0x7C00, 0xFC00, 0x7E00], dtype=np.uint16)
    off = SCALE_FIELDS[name][0]
    blocks[0, : len(specials), off:off + 2] = specials[: blocks.shape[1]].view(np.uint8).reshape(-1, 2)
    with np.errstate(all="ignore"):
        want = ref_dequantize(data, GT[name]).reshape(rows, cols)
    assert_same_bits(_quant.dequantize(data, CODE[name], rows, cols), want)


@pytest.mark.parametrize("name", ["Q4_0", "Q5_0", "Q8_0", "Q4_1"])
@pytest.mark.parametrize("cols", [32, 96, 160])
def test_odd_block_counts(name, cols, simd):
    """Rows of 1, 3 and 5 blocks exercise the kernels' tails (they step two blocks at a time)."""
    check_kernels(name, synthetic(name, 5, cols, seed=cols), 5, cols)


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_simd_and_plain_paths_agree(name):
    if not _quant.has_avx2():
        pytest.skip("CPU without AVX2/FMA/F16C")
    rows, cols = 12, 1024
    data = synthetic(name, rows, cols, seed=3)
    x = np.random.default_rng(3).standard_normal(cols).astype(np.float32)
    prev = _quant.set_simd(True)
    try:
        fast = _quant.dequantize(data, CODE[name], rows, cols), _quant.dot_rows(data, CODE[name], rows, cols, x)
        _quant.set_simd(False)
        plain = _quant.dequantize(data, CODE[name], rows, cols), _quant.dot_rows(data, CODE[name], rows, cols, x)
    finally:
        _quant.set_simd(prev)
    assert_same_bits(fast[0], plain[0])
    assert_dot_close(fast[1], plain[0], x)
    assert_dot_close(plain[1], plain[0], x)


# ---------------------------------------------------------------- the demo model's real tensors

# (tensor, rows to sample): a few rows of each big tensor keep this fast.
DEMO_TENSORS = [
    ("blk.0.attn_q.weight", 896),         # Q5_0, whole
    ("blk.3.ffn_gate.weight", 200),       # Q5_0
    ("token_embd.weight", 300),           # Q5_0, 151936 rows: sampled
    ("output.weight", 300),               # Q8_0, sampled
    ("blk.0.attn_v.weight", 128),         # Q8_0, whole
    ("blk.0.ffn_down.weight", 896),       # Q6_K, whole
    ("blk.2.ffn_down.weight", 896),       # Q4_K, whole
]


@pytest.fixture(scope="module")
def demo(demo_gguf):
    from qwenc.formats.gguf import open_gguf
    return open_gguf(demo_gguf)


def sample_rows(gf, name, n_rows, seed=0):
    """(bytes of n_rows rows chosen at random, their count, cols, type name)."""
    info = gf.tensors[name]
    cols, rows = info.shape[0], info.shape[1]
    data = gf.tensor_bytes(name).reshape(rows, -1)
    idx = np.sort(np.random.default_rng(seed).choice(rows, size=min(n_rows, rows), replace=False))
    return np.ascontiguousarray(data[idx]), len(idx), cols, DTYPE_NAMES[info.dtype]


def test_demo_has_the_types_it_should(demo):
    present = {DTYPE_NAMES.get(t.dtype) for t in demo.tensors.values()}
    assert {"Q5_0", "Q8_0", "Q4_K", "Q6_K"} <= present


@pytest.mark.parametrize("tensor,n_rows", DEMO_TENSORS, ids=[t for t, _ in DEMO_TENSORS])
def test_demo_tensors_match_reference(demo, tensor, n_rows, simd):
    data, rows, cols, name = sample_rows(demo, tensor, n_rows)
    check_kernels(name, data, rows, cols)


def test_demo_tensor_full_view_is_not_copied(demo):
    """Dequantizing straight from the mapped file (no copy of the 2-D view) works too."""
    info = demo.tensors["blk.0.attn_k.weight"]
    view = demo.tensor_bytes("blk.0.attn_k.weight")
    assert not view.flags.owndata and not view.flags.writeable
    got = _quant.dequantize(view, info.dtype, info.shape[1], info.shape[0])
    assert_same_bits(got, ref_dequantize(np.asarray(view).reshape(info.shape[1], -1), GT(info.dtype)))


# ---------------------------------------------------------------- Q8_0 quantizer

def q8_inputs():
    rng = np.random.default_rng(5)
    cases = {
        "normal": rng.standard_normal((8, 512)).astype(np.float32),
        "scales": (rng.standard_normal((16, 256)) * np.logspace(-8, 4, 16)[:, None]).astype(np.float32),
        "zeros": np.zeros((2, 64), dtype=np.float32),
        # amax 127 makes d = 1 exactly: x.5 values test round-half-away-from-zero
        "halves": np.concatenate([np.full((1, 1), 127.0), np.arange(-15.5, 16.0, 1.0)[None, :31]], axis=1).astype(np.float32),
        "tiny": np.full((1, 32), 1e-9, dtype=np.float32) * np.arange(32, dtype=np.float32),
        "mixed": np.where(rng.random((4, 128)) < 0.5, 0, rng.standard_normal((4, 128)) * 1e3).astype(np.float32),
    }
    return cases


@pytest.mark.parametrize("case", list(q8_inputs()))
def test_quantize_q8_0_matches_reference_bytes(case):
    x = q8_inputs()[case]
    got = _quant.quantize_q8_0(x)
    want = ref_quantize(x, GT.Q8_0)
    assert got.dtype == np.uint8 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_quantize_q8_0_round_trip():
    x = np.random.default_rng(9).standard_normal((4, 256)).astype(np.float32)
    back = _quant.dequantize(_quant.quantize_q8_0(x), CODE["Q8_0"], 4, 256)
    step = np.abs(x).reshape(4, -1, 32).max(-1, keepdims=True) / 127
    # half a step of rounding, plus up to 127 codes times the f16 rounding of the scale (2^-11)
    assert (np.abs(back - x).reshape(4, -1, 32) <= step * (0.5 + 127 / 2048)).all()


# ---------------------------------------------------------------- argument checking

def test_bad_arguments_raise_value_error():
    ok = synthetic("Q8_0", 2, 64, seed=0)
    with pytest.raises(ValueError, match="unsupported"):
        _quant.dequantize(ok, 10, 2, 64)  # Q2_K: not supported
    with pytest.raises(ValueError, match="needs 136 bytes, got 135"):
        _quant.dequantize(ok.reshape(-1)[:-1], CODE["Q8_0"], 2, 64)
    with pytest.raises(ValueError, match="multiple"):
        _quant.dequantize(ok, CODE["Q8_0"], 4, 16)
    with pytest.raises(ValueError, match="uint8"):
        _quant.dequantize(ok.view(np.int8), CODE["Q8_0"], 2, 64)
    with pytest.raises(ValueError, match="x must have shape"):
        _quant.dot_rows(ok, CODE["Q8_0"], 2, 64, np.zeros(32, np.float32))
    with pytest.raises(ValueError, match="multiple"):
        _quant.quantize_q8_0(np.zeros((1, 40), np.float32))


def test_simd_switch():
    assert isinstance(_quant.has_avx2(), bool)
    prev = _quant.set_simd(False)
    try:
        assert _quant.set_simd(True) is False
        assert _quant.simd_enabled() == _quant.has_avx2()
    finally:
        _quant.set_simd(prev)


def test_float_types_through_the_same_entry_points(simd):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    v = rng.standard_normal(64).astype(np.float32)
    for code, stored, exact in [(CODE["F32"], x, x), (CODE["F16"], x.astype(np.float16), x.astype(np.float16).astype(np.float32)),
                                (CODE["BF16"], (x.view(np.uint32) >> 16).astype(np.uint16),
                                 ((x.view(np.uint32) >> 16) << 16).view(np.float32))]:
        data = stored.view(np.uint8)
        assert_same_bits(_quant.dequantize(data, code, 3, 64), exact)
        assert_dot_close(_quant.dot_rows(data, code, 3, 64, v), exact, v)


# ---------------------------------------------------------------- falsifiers: the checks can tell

def wrong_q4_0_interleaved(data):
    """Q4_0 with the nibbles read in the wrong order (byte j -> values 2j, 2j + 1)."""
    blocks = data.reshape(-1, 18)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    qs = blocks[:, 2:]
    q = np.stack([qs & 0x0F, qs >> 4], axis=-1).reshape(-1, 32).astype(np.int8) - 8
    return (d * q.astype(np.float32)).reshape(-1)


def wrong_q6_k_swapped_ql(data):
    """Q6_K with the two 32-byte halves of each ql group swapped (a wrong offset)."""
    blocks = data.reshape(-1, 210).copy()
    ql = blocks[:, :128].reshape(-1, 2, 2, 32)
    blocks[:, :128] = ql[:, :, ::-1, :].reshape(-1, 128)
    return ref_dequantize(blocks, GT.Q6_K).reshape(-1)


def test_falsifier_nibble_order_is_caught():
    data = synthetic("Q4_0", 4, 256, seed=1)
    want = ref_dequantize(data, GT.Q4_0).reshape(-1)
    with pytest.raises(AssertionError):
        assert_same_bits(wrong_q4_0_interleaved(data).astype(np.float32), want)
    # and the same comparison passes the kernel
    assert_same_bits(_quant.dequantize(data, CODE["Q4_0"], 4, 256).reshape(-1), want)


def test_falsifier_q6_k_offset_is_caught():
    data = synthetic("Q6_K", 4, 512, seed=1)
    want = ref_dequantize(data, GT.Q6_K).reshape(-1)
    with pytest.raises(AssertionError):
        assert_same_bits(wrong_q6_k_swapped_ql(data), want)


@pytest.mark.parametrize("name", ["Q5_0", "Q4_K", "Q6_K", "Q8_0"])
def test_falsifier_dot_tolerance_catches_one_code_off(name):
    """The dot tolerance is tight enough to notice one value moved by one quantization step."""
    rows, cols = 4, 4864 if BLOCK[CODE[name]][0] == 256 else 896
    data = synthetic(name, rows, cols, seed=4)
    w = ref_dequantize(data, GT[name]).reshape(rows, cols)
    x = np.random.default_rng(4).standard_normal(cols).astype(np.float32)
    got = _quant.dot_rows(data, CODE[name], rows, cols, x)
    assert_dot_close(got, w, x)
    # move the largest-|x| value of each row by one step of its (sub-)block's scale
    i = int(np.argmax(np.abs(x)))
    sub = 16 if name == "Q6_K" else 32  # values sharing one scale
    blk = w[:, i // sub * sub:(i // sub + 1) * sub]
    step = np.array([np.min(np.diff(np.unique(b))) if len(np.unique(b)) > 1 else 1.0 for b in blk], np.float32)
    w_off = w.copy()
    w_off[:, i] += step
    with pytest.raises(AssertionError):
        assert_dot_close(got, w_off, x)


# ---------------------------------------------------------------- integer path: 8- and 16-bit activations
#
# Decode's products over block-quantized weights (int8 and int16 modes) quantize the activation
# row x once to 8-bit codes (an "act row": per 32 values a float32 scale, the codes and their
# sums; layout in csrc/quant.h), or to two such levels for 16 bits, and dot each weight row with
# them in integers. Two oracles:
#   - exact: the float64 dot of the reference-dequantized weights with the dequantized act row
#     xhat. The kernels sum each block's integer products exactly and only round the few float
#     scale products and sums, so they stay within DOT_RTOL of sum |w xhat|;
#   - float: the dot with the float32 x itself, off by at most sum |w| |x - xhat| (plus rounding),
#     which the act row's own rounding (half a step d / 2 per value) bounds.

ACT32 = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}


def act_parts(xq, n):
    """(codes int8 [n], d float32 [n / 32], s float32 [n / 32], bsums int16 [n / 16]) of an act row."""
    xq = np.asarray(xq).reshape(-1)
    nb = n // 32
    assert xq.size == n + 8 * nb + 2 * (n // 16)
    return (xq[:n].view(np.int8), xq[n:n + 4 * nb].view(np.float32), xq[n + 4 * nb:n + 8 * nb].view(np.float32),
            xq[n + 8 * nb:].view(np.int16))


def act_values(xq, n):
    """float64 [n]: the values xhat = d * q the act row stands for."""
    q, d, _, _ = act_parts(xq, n)
    return (q.astype(np.float64).reshape(-1, 32) * d.astype(np.float64)[:, None]).reshape(-1)


def act16_levels(xq, n):
    """The two 8-bit act rows a 16-bit row is made of."""
    xq = np.asarray(xq).reshape(-1)
    half = _quant.act_bytes(CODE["Q8_0"], n)
    assert xq.size == 2 * half
    return xq[:half], xq[half:]


def act16_values(xq, n):
    one, two = act16_levels(xq, n)
    return act_values(one, n) + act_values(two, n)


def row_values(xq, n, bits):
    """float64 [n]: the values an 8-bit or 16-bit act row stands for."""
    return act16_values(xq, n) if bits == 16 else act_values(xq, n)


def act_inputs(cols, rng):
    """Activation rows with uneven scales: ordinary values, a few large outliers (as Qwen's
    residual stream has), blocks of exact zeros and sub-1e-30 values."""
    x = rng.standard_normal((4, cols)).astype(np.float32)
    x[1] *= np.exp(rng.uniform(-6, 6, cols)).astype(np.float32)
    x[2, rng.choice(cols, 3, replace=False)] = [300.0, -1000.0, 45.0]
    x[3, :64] = 0.0
    x[3, 64:96] = 1e-31
    return x


def expected_act(x):
    """The act row fields the quantizer must produce, from numpy float32 arithmetic: d = amax / 127,
    q = rint(x * (1 / d)) (ties to even), s = d * sum(q), bsums per 16; tiny blocks give zeros."""
    xb = x.astype(np.float32).reshape(-1, 32)
    amax = np.abs(xb).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    tiny = amax < np.float32(1e-30)
    d[tiny] = 0
    with np.errstate(divide="ignore"):
        inv = np.where(tiny, np.float32(0), np.float32(1) / np.where(tiny, np.float32(1), d)).astype(np.float32)
    q = np.rint((xb * inv[:, None]).astype(np.float32)).astype(np.int64)
    s = (d * q.sum(axis=1).astype(np.float32)).astype(np.float32)
    return q.reshape(-1), d, s, q.reshape(-1, 16).sum(axis=1)


def test_quantize_activations_fields(simd):
    cols = 768
    x = act_inputs(cols, np.random.default_rng(21))
    xq = _quant.quantize_activations(x, CODE["Q8_0"])
    assert xq.shape == (4, _quant.act_bytes(CODE["Q8_0"], cols)) and xq.dtype == np.uint8
    # one layout for every type
    for name in BLOCK_TYPES:
        np.testing.assert_array_equal(_quant.quantize_activations(x, CODE[name]), xq)
    for r in range(4):
        q, d, s, bsums = act_parts(xq[r], cols)
        want_q, want_d, want_s, want_bsums = expected_act(x[r])
        np.testing.assert_array_equal(q, want_q)
        assert_same_bits(d, want_d)
        assert_same_bits(s, want_s)
        np.testing.assert_array_equal(bsums, want_bsums)
        assert np.abs(q.astype(np.int64)).max() <= 127
        # each value within half a step of its block (a hair more: x * (1/d) is rounded first);
        # blocks below 1e-30 become zeros
        step = np.repeat(d.astype(np.float64), 32)
        assert (np.abs(act_values(xq[r], cols) - x[r]) <= np.maximum(step * (0.5 + 1e-6), 1e-30)).all()


def test_quantize_activations_ties_to_even():
    # amax 127 makes d = 1 and 1 / d = 1 exactly: x.5 values round to the even neighbour
    x = np.concatenate([[127.0], np.arange(-15.5, 15.0, 1.0)]).astype(np.float32)[None, :32]
    q, d, _, _ = act_parts(_quant.quantize_activations(x, CODE["Q8_0"])[0], 32)
    assert d[0] == 1.0
    np.testing.assert_array_equal(q[1:], np.rint(x[0, 1:]).astype(np.int8))
    assert q[1] == -16 and q[2] == -14  # -15.5 -> -16, -14.5 -> -14


@pytest.mark.parametrize("bits", [8, 16])
def test_quantize_activations_simd_and_plain_bytes_equal(bits):
    if not _quant.has_avx2():
        pytest.skip("CPU without AVX2/FMA/F16C")
    x = act_inputs(1024, np.random.default_rng(22))
    x[0, 300] = np.inf
    x[0, 700] = np.nan
    x[1, 5] = -np.inf
    # exact halves of a step: the level-1 ties and level-2 values of +-128 that must clamp
    x[3, 96:128] = (np.arange(32) - 15.5).astype(np.float32)
    x[3, 96] = 127.0
    prev = _quant.set_simd(True)
    try:
        fast = _quant.quantize_activations(x, CODE["Q8_0"], bits=bits)
        _quant.set_simd(False)
        plain = _quant.quantize_activations(x, CODE["Q8_0"], bits=bits)
    finally:
        _quant.set_simd(prev)
    np.testing.assert_array_equal(fast, plain)


@pytest.mark.parametrize("name", BLOCK_TYPES)
@pytest.mark.parametrize("bits", [8, 16])
def test_int_dot_non_finite_activations_give_nan(name, bits, simd):
    rows, cols = 3, 512
    data = synthetic(name, rows, cols, seed=8)
    x = np.random.default_rng(8).standard_normal(cols).astype(np.float32)
    x[5] = np.inf
    x[40] = -np.inf
    xq = _quant.quantize_activations(x[None], CODE[name], bits=bits)[0]
    q, d, _, _ = act_parts(xq[:_quant.act_bytes(CODE[name], cols)], cols)  # (level 1 of a 16-bit row)
    assert np.isnan(d[0]) and not q[:32].any()
    assert np.isnan(_quant.dot_rows_act(data, CODE[name], rows, cols, xq, bits=bits)).all()


def int_dot_case(name, rows, cols, seed, bits=8):
    """(weights bytes, reference float32 rows, x, act row) for one type."""
    data = synthetic(name, rows, cols, seed=seed)
    w = ref_dequantize(data, GT[name]).reshape(rows, cols)
    x = act_inputs(cols, np.random.default_rng(seed))[seed % 3]
    return data, w, x, _quant.quantize_activations(x[None], CODE[name], bits=bits)[0]


# Types whose blocks add a float min to the scaled codes (the other types' offsets are integers).
MIN_TYPES = {"Q4_1", "Q5_1", "Q4_K", "Q5_K"}
# Byte ranges of the codes in a block of each min type (quant.h's layouts).
CODE_BYTES = {"Q4_1": (4, 20), "Q5_1": (4, 24), "Q4_K": (16, 144), "Q5_K": (16, 176)}


def weight_mins(data, name, rows, cols):
    """float32 [rows, cols]: the min term of each value's (sub-)block (what code 0 dequantizes
    to: m for Q4_1/Q5_1, -dmin * m for Q4_K/Q5_K), or None for types without one."""
    if name not in MIN_TYPES:
        return None
    nbytes = BLOCK[CODE[name]][1]
    blocks = np.ascontiguousarray(data).reshape(rows, -1, nbytes).copy()
    lo, hi = CODE_BYTES[name]
    blocks[..., lo:hi] = 0
    return ref_dequantize(blocks.reshape(rows, -1), GT[name]).reshape(rows, cols)


def assert_int_dot_close(got, w, xhat, mins=None):
    """got[r] = rows w[r] . xhat (xhat float64) to within DOT_RTOL of sum |w xhat|. The integer
    sums are exact, so only float scale products and the sum over blocks round. Where the type has
    mins, the codes' part and the mins' part are two float terms that may cancel: the bound then
    uses sum (|w| + |min|) |xhat|."""
    w64 = w.astype(np.float64)
    mag = np.abs(w64) if mins is None else np.abs(w64) + np.abs(mins.astype(np.float64))
    exact = w64 @ xhat
    bound = DOT_RTOL * (mag @ np.abs(xhat)) + 1e-30
    err = np.abs(got.astype(np.float64) - exact)
    if (err > bound).any():
        r = int(np.argmax(err / bound))
        raise AssertionError(f"{(err > bound).sum()} of {len(got)} integer dots off: row {r} got {got[r]!r}, "
                             f"exact {exact[r]!r}, error {err[r]:.3g} > bound {bound[r]:.3g}")


def assert_within_act_error(got, w, x, xhat):
    """got[r] = w[r] . x up to what quantizing x can move it: sum |w| |x - xhat| (+ rounding)."""
    w64, x64 = w.astype(np.float64), x.astype(np.float64)
    bound = np.abs(w64) @ np.abs(x64 - xhat) + DOT_RTOL * (np.abs(w64) @ np.abs(x64)) + 1e-30
    err = np.abs(got.astype(np.float64) - w64 @ x64)
    assert (err <= bound).all(), f"max error / bound {np.max(err / bound):.3g}"


@pytest.mark.parametrize("name", BLOCK_TYPES)
@pytest.mark.parametrize("cols", [256, 768, 4864])
@pytest.mark.parametrize("bits", [8, 16])
def test_int_dot_matches_reference(name, cols, bits, simd):
    rows = 9
    data, w, x, xq = int_dot_case(name, rows, cols, seed=cols % 7, bits=bits)
    xhat = row_values(xq, cols, bits)
    got = _quant.dot_rows_act(data, CODE[name], rows, cols, xq, bits=bits)
    assert_int_dot_close(got, w, xhat, weight_mins(data, name, rows, cols))
    assert_within_act_error(got, w, x, xhat)
    # and the float fused kernel is within the same bound of the integer one's target
    fused = _quant.dot_rows(data, CODE[name], rows, cols, x)
    assert_within_act_error(fused, w, x, xhat)


@pytest.mark.parametrize("name", BLOCK_TYPES)
@pytest.mark.parametrize("bits", [8, 16])
def test_int_dot_random_blocks(name, bits, simd):
    """Random bytes everywhere but the scales: every code pattern, Q8_0's -128 included, against
    the largest activation codes (+-127, on both levels of a 16-bit row): the extremes of the
    products, which must not overflow."""
    rows, cols = 16, 1280 if name in ACT32 else 1536
    data = random_blocks(name, rows, cols, np.random.default_rng(17))
    w = ref_dequantize(data, GT[name]).reshape(rows, cols)
    x = np.random.default_rng(17).standard_normal(cols).astype(np.float32)
    # the largest |x| in some blocks: level-1 codes of +-127
    x[::37] *= 50
    # blocks whose values sit just below a half step: level-2 codes near +-127 across the block
    # (127 first makes d = 1, so t = x, and t - rint(t) = +-0.496 gives q2 = +-127)
    x[:64] = np.sign(x[:64]) * np.where(np.arange(64) % 32 == 0, 127, np.arange(64) % 32 + 0.496)
    xq = _quant.quantize_activations(x[None], CODE[name], bits=bits)[0]
    if bits == 16:
        _, two = act16_levels(xq, cols)
        assert np.abs(act_parts(two, cols)[0][:64].astype(int)).max() >= 120
    assert_int_dot_close(_quant.dot_rows_act(data, CODE[name], rows, cols, xq, bits=bits), w,
                         row_values(xq, cols, bits), weight_mins(data, name, rows, cols))


@pytest.mark.parametrize("name", ["Q4_0", "Q5_0", "Q8_0", "Q4_1", "Q5_1"])
@pytest.mark.parametrize("cols", [32, 96, 160, 288])
@pytest.mark.parametrize("bits", [8, 16])
def test_int_dot_odd_block_counts(name, cols, bits, simd):
    """Rows of 1, 3, 5 and 9 blocks: the AVX2 kernels take 8 blocks a step, then fewer."""
    data, w, x, xq = int_dot_case(name, 5, cols, seed=cols, bits=bits)
    assert_int_dot_close(_quant.dot_rows_act(data, CODE[name], 5, cols, xq, bits=bits), w,
                         row_values(xq, cols, bits), weight_mins(data, name, 5, cols))


@pytest.mark.parametrize("name", BLOCK_TYPES)
@pytest.mark.parametrize("bits", [8, 16])
def test_int_dot_simd_and_plain_agree(name, bits):
    if not _quant.has_avx2():
        pytest.skip("CPU without AVX2/FMA/F16C")
    rows, cols = 12, 1024
    data, w, x, xq = int_dot_case(name, rows, cols, seed=5, bits=bits)
    prev = _quant.set_simd(True)
    try:
        fast = _quant.dot_rows_act(data, CODE[name], rows, cols, xq, bits=bits)
        _quant.set_simd(False)
        plain = _quant.dot_rows_act(data, CODE[name], rows, cols, xq, bits=bits)
    finally:
        _quant.set_simd(prev)
    xhat = row_values(xq, cols, bits)
    mins = weight_mins(data, name, rows, cols)
    assert_int_dot_close(fast, w, xhat, mins)
    assert_int_dot_close(plain, w, xhat, mins)
    mag = np.abs(w.astype(np.float64)) + (0 if mins is None else np.abs(mins.astype(np.float64)))
    assert (np.abs(fast.astype(np.float64) - plain) <= 2 * DOT_RTOL * (mag @ np.abs(xhat))).all()


@pytest.mark.parametrize("tensor,n_rows", DEMO_TENSORS, ids=[t for t, _ in DEMO_TENSORS])
@pytest.mark.parametrize("bits", [8, 16])
def test_demo_tensors_int_dot(demo, tensor, n_rows, bits, simd):
    data, rows, cols, name = sample_rows(demo, tensor, n_rows)
    w = ref_dequantize(data, GT[name]).reshape(rows, cols)
    x = act_inputs(cols, np.random.default_rng(3))[2]
    xq = _quant.quantize_activations(x[None], CODE[name], bits=bits)[0]
    xhat = row_values(xq, cols, bits)
    got = _quant.dot_rows_act(data, CODE[name], rows, cols, xq, bits=bits)
    assert_int_dot_close(got, w, xhat, weight_mins(data, name, rows, cols))
    assert_within_act_error(got, w, x, xhat)


def test_int_dot_argument_checks():
    data = synthetic("Q8_0", 2, 64, seed=0)
    xq = _quant.quantize_activations(np.ones((1, 64), np.float32), CODE["Q8_0"])[0]
    assert _quant.act_bytes(CODE["F32"], 64) == 0 and _quant.act_bytes(CODE["BF16"], 64) == 0
    assert _quant.act_bytes(CODE["Q8_0"], 64) == 64 + 8 * 2 + 2 * 4
    assert _quant.act_bytes(CODE["Q4_K"], 512) == 512 + 8 * 16 + 2 * 32
    with pytest.raises(ValueError, match="no integer dot"):
        _quant.quantize_activations(np.ones((1, 64), np.float32), CODE["F32"])
    with pytest.raises(ValueError, match="xq must be"):
        _quant.dot_rows_act(data, CODE["Q8_0"], 2, 64, xq[:-1])
    with pytest.raises(ValueError, match="multiple"):
        _quant.quantize_activations(np.ones((1, 48), np.float32), CODE["Q8_0"])


# ---- falsifiers: the integer checks reject near misses

def test_falsifier_act_step_is_caught():
    """Moving one activation value by one step of its block breaks the exact-dot check."""
    data, w, x, xq = int_dot_case("Q5_0", 4, 896, seed=2)
    got = _quant.dot_rows_act(data, CODE["Q5_0"], 4, 896, xq)
    xhat = act_values(xq, 896)
    assert_int_dot_close(got, w, xhat)
    q, d, _, _ = act_parts(xq, 896)
    i = int(np.argmax(np.abs(w).sum(axis=0)))
    moved = xhat.copy()
    moved[i] += d[i // 32]
    with pytest.raises(AssertionError):
        assert_int_dot_close(got, w, moved)


def reference_without_mins(data, name, rows, cols):
    """Q4_K rows with the min term left out: d * sc * q only (a kernel ignoring dmin * m)."""
    blocks = data.reshape(rows, -1, 144).copy()
    blocks[..., 2:4] = 0  # dmin = +0
    return ref_dequantize(blocks.reshape(rows, -1), GT[name]).reshape(rows, cols)


def reference_unsigned_q5_0(data, rows, cols):
    """Q5_0 with the codes' offset of 16 forgotten (a wrong sign trick / offset)."""
    w = ref_dequantize(data, GT.Q5_0).reshape(rows, -1, 32)
    d = data.reshape(rows, -1, 22)[..., :2].copy().view(np.float16).astype(np.float32)
    return (w + 16 * d).reshape(rows, cols)


@pytest.mark.parametrize("case", ["q4_k_no_mins", "q5_0_no_offset", "q6_k_swapped_scales"])
def test_falsifier_wrong_formula_is_caught(case):
    name = {"q4_k_no_mins": "Q4_K", "q5_0_no_offset": "Q5_0", "q6_k_swapped_scales": "Q6_K"}[case]
    rows, cols = 6, 1024
    data, w, x, xq = int_dot_case(name, rows, cols, seed=9)
    got = _quant.dot_rows_act(data, CODE[name], rows, cols, xq)
    xhat = act_values(xq, cols)
    mins = weight_mins(data, name, rows, cols)
    assert_int_dot_close(got, w, xhat, mins)
    if case == "q4_k_no_mins":
        wrong = reference_without_mins(data, name, rows, cols)
    elif case == "q5_0_no_offset":
        wrong = reference_unsigned_q5_0(data, rows, cols)
    else:
        blocks = data.reshape(rows, -1, 210).copy()
        sc = blocks[..., 192:208].reshape(rows, -1, 8, 2)
        blocks[..., 192:208] = sc[..., ::-1].reshape(rows, -1, 16)
        wrong = ref_dequantize(blocks.reshape(rows, -1), GT.Q6_K).reshape(rows, cols)
    with pytest.raises(AssertionError):
        assert_int_dot_close(got, wrong, xhat, mins)


@pytest.mark.parametrize("name,field", [("Q5_0", "bsums"), ("Q4_0", "bsums"), ("Q6_K", "bsums"), ("Q4_1", "s"),
                                        ("Q5_1", "s"), ("Q4_K", "s"), ("Q5_K", "s")])
def test_falsifier_corrupt_activation_sums(name, field):
    """The AVX2 kernels take the offsets and mins through the act row's sums, the plain ones from
    the codes: zeroing the sums breaks the first (so the check sees them) and not the second."""
    if not _quant.has_avx2():
        pytest.skip("CPU without AVX2/FMA/F16C")
    rows, cols = 6, 1024
    data, w, x, xq = int_dot_case(name, rows, cols, seed=10)
    xhat = act_values(xq, cols)
    mins = weight_mins(data, name, rows, cols)
    start, end = {"s": (cols + cols // 8, cols + cols // 4), "bsums": (cols + cols // 4, None)}[field]
    bad = xq.copy()
    bad[start:end] = 0
    prev = _quant.set_simd(True)
    try:
        assert_int_dot_close(_quant.dot_rows_act(data, CODE[name], rows, cols, xq), w, xhat, mins)
        with pytest.raises(AssertionError):
            assert_int_dot_close(_quant.dot_rows_act(data, CODE[name], rows, cols, bad), w, xhat, mins)
        _quant.set_simd(False)
        assert_int_dot_close(_quant.dot_rows_act(data, CODE[name], rows, cols, bad), w, xhat, mins)
    finally:
        _quant.set_simd(prev)


# ---- qw_matmul's decode path (qwenc._ops, as the model calls it)

@pytest.mark.parametrize("name", BLOCK_TYPES)
@pytest.mark.parametrize("M", [1, 2, 3, 4])
@pytest.mark.parametrize("bits", [8, 16])
def test_matmul_decode_path_int(name, M, bits, simd):
    """qw_matmul's decode path in the int8 and int16 modes (their codes are the bits): the same
    kernel as dot_rows_act, bit for bit, plus the bias."""
    from qwenc import _ops
    assert _ops.ACTIVATIONS[f"int{bits}"] == bits
    N, K = 37, 512
    data = synthetic(name, N, K, seed=M + bits)
    w = ref_dequantize(data, GT[name]).reshape(N, K)
    rng = np.random.default_rng(M)
    x = act_inputs(K, rng)[np.arange(M) % 3]
    bias = rng.standard_normal(N).astype(np.float32)
    y = np.empty((M, N), np.float32)
    _ops.matmul(data.reshape(-1), CODE[name], N, K, np.ascontiguousarray(x), y, bias, bits)
    xq = _quant.quantize_activations(x, CODE[name], bits=bits)
    for m in range(M):
        xhat = row_values(xq[m], K, bits)
        assert_int_dot_close(y[m] - bias, w, xhat, weight_mins(data, name, N, K))
        assert_within_act_error(y[m] - bias, w, x[m], xhat)
        want = _quant.dot_rows_act(data, CODE[name], N, K, xq[m], bits=bits) + bias
        np.testing.assert_array_equal(y[m], want)


@pytest.mark.parametrize("name", BLOCK_TYPES)
@pytest.mark.parametrize("bits", [8, 16])
def test_matmul_prefill_sized_paths_give_the_same_bits(name, bits):
    """Prefill- and batch-sized products (M >= 8) on every SIMD path this CPU has: the pair kernels
    (avx512w; for Q4_0 and Q5_0 two whole groups a call at 8 and 16 rows) and the AMX tiles (amx:
    16 act rows against 16 weight rows per tile product, a short last block of act rows and an odd
    last group of weight rows on the other kernels) give the 256-bit kernels' bits, which are
    dot_rows_act's for each row, within the integer dot's bound of the exact product; the bias
    added after. Row counts leave short blocks (17, 35) and an odd group (37 rows: 4 whole groups
    and 5 rows). A CPU without SIMD checks plain C alone."""
    from qwenc import _ops
    simd = [p for p in _ops.simd_paths() if p != "plain"] or ["plain"]  # plain C: its own kernels
    N, K = 37, 768
    bias = np.random.default_rng(bits).standard_normal(N).astype(np.float32)
    data = synthetic(name, N, K, seed=bits + 7)
    w = ref_dequantize(data, GT[name]).reshape(N, K)
    mins = weight_mins(data, name, N, K)
    for M in (8, 16, 17, 35, 48):
        x = act_inputs(K, np.random.default_rng(M))[np.arange(M) % 3]
        x = x * np.random.default_rng(M).uniform(0.5, 2.0, (M, 1)).astype(np.float32)
        outs = {}
        prev = _ops.simd_path(), _quant.simd_path()
        try:
            for p in simd:
                _ops.set_simd_path(p)
                _quant.set_simd_path(p)
                y = np.full((M, N), np.nan, np.float32)
                _ops.matmul(data.reshape(-1), CODE[name], N, K, np.ascontiguousarray(x), y, bias, bits)
                outs[p] = y
            _quant.set_simd_path(simd[0])
            xq = _quant.quantize_activations(x, CODE[name], bits=bits)
            want = np.stack([_quant.dot_rows_act(data, CODE[name], N, K, xq[m], bits=bits) for m in range(M)])
        finally:
            _ops.set_simd_path(prev[0])
            _quant.set_simd_path(prev[1])
        for p, y in outs.items():
            assert_same_bits(y, (want + bias).astype(np.float32))
        for m in range(M):
            assert_int_dot_close(want[m], w, row_values(xq[m], K, bits), mins)


def awkward_act_rows(K, rng):
    """35 act rows (two whole 16-row blocks and a short last one) with every kind of act block:
    act_inputs' four kinds (outliers, blocks of zeros and of sub-1e-30 values), values that round
    to -0 and to halves (ties to even), a level-2 code at its clamp, blocks with +-inf and NaN,
    negative zeros and subnormals."""
    base = act_inputs(K, rng)
    x = base[np.arange(35) % 4].copy()
    x *= rng.uniform(0.5, 2.0, (35, 1)).astype(np.float32)
    x[4, :32] = np.float32(-0.3 / 127)  # q1 = round(-0.3 / max) -> -0 unless one value sets the scale
    x[4, 0] = 1.0
    x[5, 32:64] = (np.arange(32, dtype=np.float32) - 15.5) / np.float32(15.5) * np.float32(127 / 127)
    x[6, 64:96] = np.float32(2.5 / 127)
    x[6, 64] = 1.0
    x[7, 96:128] = -0.0
    x[8, 128:160] = np.float32(1e-40)  # subnormal: below the tiny-block limit
    x[9, 160:192] = 126.5 / 127.0
    x[9, 160] = 1.0
    x[20, 5] = np.inf
    x[21, 40] = -np.inf
    x[22, 70] = np.nan
    x[34, 3] = np.inf  # in the short last block's plain rows
    return x


@pytest.mark.parametrize("name", BLOCK_TYPES)
@pytest.mark.parametrize("bits", [8, 16])
def test_matmul_prefill_awkward_activations_give_the_same_bits(name, bits):
    """Prefill-sized products quantize their act rows on the way to the kernels (on AMX CPUs
    straight into the tile blocks, not through act.c's rows): with awkward act blocks (zeros,
    tiny and subnormal values, -0, ties, the level-2 clamp, infinities and NaN) every SIMD path
    gives dot_rows_act's bits on act.c's quantized rows, row by row, NaN rows included."""
    from qwenc import _ops
    simd = [p for p in _ops.simd_paths() if p != "plain"] or ["plain"]
    N, K = 24, 256
    data = synthetic(name, N, K, seed=bits + 11)
    x = np.ascontiguousarray(awkward_act_rows(K, np.random.default_rng(bits)))
    xq = _quant.quantize_activations(x, CODE[name], bits=bits)
    want = np.stack([_quant.dot_rows_act(data, CODE[name], N, K, xq[m], bits=bits) for m in range(len(x))])
    assert np.isnan(want[[20, 21, 22, 34]]).all() and not np.isnan(np.delete(want, [20, 21, 22, 34], 0)).any()
    prev = _ops.simd_path()
    try:
        for p in simd:
            _ops.set_simd_path(p)
            y = np.full((len(x), N), np.nan, np.float32)
            _ops.matmul(data.reshape(-1), CODE[name], N, K, x, y, None, bits)
            assert_same_bits(y, want.astype(np.float32))
    finally:
        _ops.set_simd_path(prev)


# Byte ranges of each type's code fields in a block, and the byte that sets every code there to
# the type's largest magnitude (Q4_0 -8, Q4_1 15, Q5_0 -16, Q5_1 31, Q8_0 -128, Q4_K 15, Q5_K 31,
# Q6_K -32).
EXTREME_CODES = {"Q4_0": ([(2, 18)], 0x00), "Q4_1": ([(4, 20)], 0xFF), "Q5_0": ([(2, 22)], 0x00),
                 "Q5_1": ([(4, 24)], 0xFF), "Q8_0": ([(2, 34)], 0x80), "Q4_K": ([(16, 144)], 0xFF),
                 "Q5_K": ([(16, 176)], 0xFF), "Q6_K": ([(0, 192)], 0x00)}


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_matmul_prefill_extreme_codes_give_the_same_bits(name):
    """The largest block sums a 16-bit row can reach: every weight code at its type's largest
    magnitude, the act values at q1 = 126 and q2 = 127 or 126 in turn (the level-2 code at its
    limit, odd sums over each pair of values) but the one that sets the block's scale. The bf16
    tiles (amxbf16) take only the types whose partial sums stay below 2^24, exact in float32
    whatever order and rounding the tile unit uses (Q5_0 reaches 16.5 million here: 32 x 32383 x
    16). Every path gives dot_rows_act's bits. (Q8_0 routed to the bf16 tiles fails here: its codes
    are outside their code table. Q5_1 and Q5_K routed there, past 2^24, gave the right bits on the
    Xeon measured, but the rounding inside a tile product is not specified, so they stay off.)"""
    from qwenc import _ops
    simd = [p for p in _ops.simd_paths() if p != "plain"] or ["plain"]
    N, K, M = 37, 512, 32
    raw = random_blocks(name, N, K, np.random.default_rng(5))
    elems, nbytes = BLOCK[CODE[name]]
    blocks = raw.reshape(N, K // elems, nbytes)
    ranges, byte = EXTREME_CODES[name]
    for a, b in ranges:
        blocks[..., a:b] = byte
    data = blocks.reshape(N, -1)
    x = np.full((M, K), 126.498 / 127.0, np.float32)
    x[:, 1::2] = 126.494 / 127.0
    x[:, ::32] = 1.0
    x[1::2] *= -1.0
    prev = _ops.simd_path(), _quant.simd_path()
    try:
        xq = _quant.quantize_activations(x, CODE[name], bits=16)
        want = np.stack([_quant.dot_rows_act(data, CODE[name], N, K, xq[m], bits=16) for m in range(M)])
        for p in simd:
            _ops.set_simd_path(p)
            y = np.full((M, N), np.nan, np.float32)
            _ops.matmul(data.reshape(-1), CODE[name], N, K, x, y, None, 16)
            assert_same_bits(y, want.astype(np.float32))
    finally:
        _ops.set_simd_path(prev[0])
        _quant.set_simd_path(prev[1])


def test_matmul_prefill_beside_another_copy_of_the_kernels(tmp_path):
    """A second copy of the kernels in the process (here _ops loaded again from a copy of its
    file; in use, any library with AMX) may set the tile configuration of the same thread between
    two calls: each call loads its own unless the tile unit holds it already (read back from it,
    not remembered). A configuration remembered across calls ran Q4_K's tiles on the shapes
    another copy had set for Q6_K: wrong products, or an invalid-opcode fault."""
    import importlib.util
    import shutil
    from qwenc import _ops
    copy = tmp_path / os.path.basename(_ops.__file__)
    shutil.copy(_ops.__file__, copy)
    spec = importlib.util.spec_from_file_location("qwenc._ops", copy)
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    assert other is not _ops
    N, K, M = 24, 512, 32
    x = np.random.default_rng(5).standard_normal((M, K)).astype(np.float32)
    mats = {name: synthetic(name, N, K, seed=11).reshape(-1) for name in ("Q4_K", "Q6_K")}
    alone = {}
    for name, w in mats.items():
        alone[name] = np.empty((M, N), np.float32)
        _ops.matmul(w, CODE[name], N, K, x, alone[name], None, 16)
    for _ in range(3):
        for mod, name in ((_ops, "Q4_K"), (other, "Q6_K"), (_ops, "Q4_K"), (other, "Q6_K"), (other, "Q4_K")):
            y = np.empty((M, N), np.float32)
            mod.matmul(mats[name], CODE[name], N, K, x, y, None, 16)
            np.testing.assert_array_equal(y, alone[name])


@pytest.mark.parametrize("bits", [8, 16])
def test_a_group_of_types_with_other_tile_shapes_equals_its_products_alone(bits, simd):
    """Q4_K, Q6_K and Q8_0 products in one group (a layer's q, k and v can be so): each thread
    runs their AMX items one after another with the tiles left loaded between them, so each item
    must see that the tile unit holds another type's shapes (Q6_K's 16-value groups take other
    tiles) and load its own. Every output equals the product run alone, bit for bit."""
    from qwenc import _ops
    K, M = 512, 48
    x = np.random.default_rng(9).standard_normal((M, K)).astype(np.float32)
    mats = [(synthetic(name, n, K, seed=s).reshape(-1), CODE[name], n)
            for name, n, s in (("Q4_K", 40, 1), ("Q6_K", 24, 2), ("Q8_0", 56, 3), ("Q6_K", 8, 4))]
    for order in (mats, mats[::-1]):
        outs = [np.full((M, n), np.nan, np.float32) for _, _, n in order]
        _ops.matmul_group([(w, dt, n, o, None) for (w, dt, n), o in zip(order, outs)], x, bits)
        for (w, dt, n), o in zip(order, outs):
            want = np.empty((M, n), np.float32)
            _ops.matmul(w, dt, n, K, x, want, None, bits)
            np.testing.assert_array_equal(o, want)


@pytest.mark.parametrize("bits", [8, 16])
def test_matmul_prefill_rows_do_not_mix(bits, simd):
    """A change in one act row changes that row's outputs only, on every path, at the last row of
    a 16-row block and at the first (the AMX kernels take 16 rows per tile: a row read from the
    wrong place in the block would show here)."""
    from qwenc import _ops
    N, K, M = 24, 512, 32
    data = synthetic("Q4_K", N, K, seed=3).reshape(-1)
    x = np.random.default_rng(bits).standard_normal((M, K)).astype(np.float32)
    y0 = np.empty((M, N), np.float32)
    _ops.matmul(data, CODE["Q4_K"], N, K, x, y0, None, bits)
    for row in (15, 16):
        x2 = x.copy()
        x2[row] *= -1.5
        y = np.empty((M, N), np.float32)
        _ops.matmul(data, CODE["Q4_K"], N, K, x2, y, None, bits)
        changed = ~(y == y0).all(axis=1)
        assert changed.tolist() == [m == row for m in range(M)]


def test_matmul_activation_modes_bit_for_bit():
    """act=f32 (the default) is the float fused dot, act=int8 the integer dot, bit for bit; both
    per call, so two models in one process can differ. An unknown code is refused."""
    from qwenc import _ops
    rng = np.random.default_rng(0)
    w = _quant.quantize_q8_0(rng.standard_normal((8, 256)).astype(np.float32))
    x = rng.standard_normal((1, 256)).astype(np.float32)
    xq = _quant.quantize_activations(x, CODE["Q8_0"])[0]
    y = np.empty((1, 8), np.float32)
    _ops.matmul(w.reshape(-1), CODE["Q8_0"], 8, 256, x, y)
    assert np.array_equal(y[0], _quant.dot_rows(w, CODE["Q8_0"], 8, 256, x[0]))
    _ops.matmul(w.reshape(-1), CODE["Q8_0"], 8, 256, x, y, None, INT8)
    assert np.array_equal(y[0], _quant.dot_rows_act(w, CODE["Q8_0"], 8, 256, xq))
    assert not np.array_equal(y[0], _quant.dot_rows(w, CODE["Q8_0"], 8, 256, x[0]))
    _ops.matmul(w.reshape(-1), CODE["Q8_0"], 8, 256, x, y, None, _ops.ACTIVATIONS["f32"])
    assert np.array_equal(y[0], _quant.dot_rows(w, CODE["Q8_0"], 8, 256, x[0]))
    with pytest.raises(ValueError, match="activation"):
        _ops.matmul(w.reshape(-1), CODE["Q8_0"], 8, 256, x, y, None, 3)


# ---- 16-bit act rows: two 8-bit levels (csrc/quant.h)
#
# Level 1 is the 8-bit act row of x; level 2 holds the rounding left over, in steps of d / 256.
# The dot tests above run on both row kinds (xhat = d q1 + (d / 256) q2 for 16-bit rows); here,
# the level-2 fields and what the extra level buys.

def expected_act16_level2(x):
    """Level-2 codes, d, s and bsums from numpy float32 arithmetic: with t = x * (1 / d) as level 1
    computes it, q2 = clip(rint(256 (t - rint(t))), -127, 127); s is the whole row's block value
    sum, d2 (256 sum q1 + sum q2)."""
    q1, d, _, _ = expected_act(x)
    xb = x.astype(np.float32).reshape(-1, 32)
    tiny = d == 0
    with np.errstate(divide="ignore"):
        inv = np.where(tiny, np.float32(0), np.float32(1) / np.where(tiny, np.float32(1), d)).astype(np.float32)
    t = (xb * inv[:, None]).astype(np.float32)
    r = ((t - np.rint(t)) * np.float32(256)).astype(np.float32)
    q2 = np.clip(np.rint(r), -127, 127).astype(np.int64)
    d2 = (d * np.float32(1 / 256)).astype(np.float32)
    s2 = (d2 * (256 * q1.reshape(-1, 32).sum(axis=1) + q2.sum(axis=1)).astype(np.float32)).astype(np.float32)
    return q2.reshape(-1), d2, s2, q2.reshape(-1, 16).sum(axis=1)


def test_quantize_act16_fields(simd):
    cols = 768
    x = act_inputs(cols, np.random.default_rng(31))
    xq = _quant.quantize_activations(x, CODE["Q5_0"], bits=16)
    assert xq.shape == (4, _quant.act_bytes(CODE["Q5_0"], cols, bits=16)) and xq.dtype == np.uint8
    eight = _quant.quantize_activations(x, CODE["Q5_0"])
    for r in range(4):
        one, two = act16_levels(xq[r], cols)
        np.testing.assert_array_equal(one, eight[r])  # level 1 is the 8-bit row
        q2, d2, s2, bs2 = act_parts(two, cols)
        want = expected_act16_level2(x[r])
        np.testing.assert_array_equal(q2, want[0])
        assert_same_bits(d2, want[1])
        assert_same_bits(s2, want[2])
        np.testing.assert_array_equal(bs2, want[3])
        assert np.abs(q2.astype(np.int64)).max() <= 127
        # each value within a 512th of its block's level-1 step (a 256th where level 2 clamped)
        d = np.repeat(act_parts(one, cols)[1].astype(np.float64), 32)
        err = np.abs(act16_values(xq[r], cols) - x[r])
        assert (err <= np.maximum(d * (1 / 256 + 1e-6), 1e-30)).all()
        assert np.median(err[d > 0] / d[d > 0]) < 1 / 700  # typical error ~ step / 1024


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_int16_error_is_far_below_int8(name):
    """What the 16-bit rows are for: against the float dot w . x, their error is hundreds of
    times smaller than the 8-bit rows'. An 8-bit result (level 2 ignored) fails the 16-bit bound,
    so the checks above can tell the two apart."""
    rows, cols = 64, 1024
    data = synthetic(name, rows, cols, seed=12)
    w = ref_dequantize(data, GT[name]).reshape(rows, cols).astype(np.float64)
    x = act_inputs(cols, np.random.default_rng(12))[0]
    exact = w @ x.astype(np.float64)
    e16 = _quant.dot_rows_act(data, CODE[name], rows, cols, _quant.quantize_activations(x[None], CODE[name], bits=16)[0],
                              bits=16) - exact
    xq8 = _quant.quantize_activations(x[None], CODE[name])[0]
    e8 = _quant.dot_rows_act(data, CODE[name], rows, cols, xq8) - exact
    assert np.sqrt(np.mean(e16 ** 2)) * 100 < np.sqrt(np.mean(e8 ** 2))
    with pytest.raises(AssertionError):
        xq16 = _quant.quantize_activations(x[None], CODE[name], bits=16)[0]
        assert_int_dot_close(e8 + exact, w, act16_values(xq16, cols), weight_mins(data, name, rows, cols))


def test_int16_argument_checks():
    data = _quant.quantize_q8_0(np.ones((2, 64), np.float32))
    xq = _quant.quantize_activations(np.ones((1, 64), np.float32), CODE["Q8_0"], bits=16)[0]
    with pytest.raises(ValueError, match="bits"):
        _quant.quantize_activations(np.ones((1, 64), np.float32), CODE["Q8_0"], bits=12)
    with pytest.raises(ValueError, match="xq must be"):
        _quant.dot_rows_act(data, CODE["Q8_0"], 2, 64, xq)  # a 16-bit row read as 8-bit
    want = _quant.dot_rows(data, CODE["Q8_0"], 2, 64, np.ones(64, np.float32))
    np.testing.assert_allclose(_quant.dot_rows_act(data, CODE["Q8_0"], 2, 64, xq, bits=16), want, rtol=1e-6)
