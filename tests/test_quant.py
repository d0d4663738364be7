"""Row kernels of every block-quantized type against the gguf package's reference (de)quantizers.

The oracle is `gguf.quants`: dequantize must agree bit for bit (the kernels evaluate the same
float32 formula in the same order), the fused dot must agree with a float64 dot of the reference
rows to float32 accuracy, on both the AVX2 and the plain C path, and the Q8_0 quantizer must
produce the same bytes. Data: real tensors of the demo model where it has the type, seeded random
blocks for all types. The falsifier tests at the end show these comparisons reject near misses.
"""
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GT  # noqa: E402
from gguf.quants import dequantize as ref_dequantize  # noqa: E402
from gguf.quants import quantize as ref_quantize  # noqa: E402

from qwenc import _quant  # noqa: E402
from qwenc.tensors import BLOCK, DTYPE_NAMES  # noqa: E402

BLOCK_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
CODE = {name: code for code, name in DTYPE_NAMES.items()}
# Types gguf's Python package can quantize (the k-quants it can only dequantize).
REF_QUANTIZABLE = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}
# Byte offsets of the f16 scale fields (d, and dmin / m where the type has one).
SCALE_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
                "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}

# |dot - exact| <= DOT_RTOL * sum|w_i x_i|: float32 accumulation over a few thousand terms stays
# within ~1e-6 of that bound; a single code off by one in a row breaks it (see the falsifier).
DOT_RTOL = 1e-5

SIMD_MODES = [pytest.param(True, id="avx2"), pytest.param(False, id="plain")]


@pytest.fixture(params=SIMD_MODES)
def simd(request):
    """Run the test on the AVX2 path and on the plain C path, restoring the setting after."""
    if request.param and not _quant.has_avx2():
        pytest.skip("CPU without AVX2/FMA/F16C")
    prev = _quant.set_simd(request.param)
    yield request.param
    _quant.set_simd(prev)


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
    from qwenc.gguf import open_gguf
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
