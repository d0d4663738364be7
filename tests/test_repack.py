"""The integer path's row-interleaved ("R8") layouts: repacking keeps every value, and every
product on a repacked matrix gives, bit for bit, what it gives on the stored one.

Oracles: the gguf package's dequantization of the stored bytes (the repacked matrix must widen
to exactly those floats, every row, padding rows excluded), and the products on the stored
layout (tested against numpy in test_quant.py). Row counts that are not multiples of 8 exercise
the zero padding of the last group; block counts of 1, 3, 5 and 9 the kernels' loops.
"""
import numpy as np
import pytest

from qwenc import _ops, _quant
from qwenc.formats.tensors import BF16, F32
from test_quant import (BLOCK_TYPES, CODE, GT, act_inputs, assert_int_dot_close, random_blocks,  # noqa: F401
                        ref_dequantize, row_values, synthetic, weight_mins)

# Bytes of one record (a block of 8 rows) of each repacked layout (csrc/intdot.c).
RECORD_BYTES = {"Q4_0": 144, "Q4_1": 160, "Q5_0": 176, "Q5_1": 192, "Q8_0": 272, "Q4_K": 1184, "Q5_K": 1440,
                "Q6_K": 1680}
BS = {name: 256 if name.endswith("_K") else 32 for name in BLOCK_TYPES}
K_CASES = {name: ([32, 96, 160, 288] if name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0") else [256, 768])
           for name in BLOCK_TYPES}


def bits_equal(a, b):
    return ((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))).all()


@pytest.mark.parametrize("name", BLOCK_TYPES)
@pytest.mark.parametrize("N", [1, 8, 13])
def test_repacked_values_are_the_stored_values(name, N):
    """Every row of the repacked matrix widens to the reference dequantization of the stored row,
    bit for bit, including blocks with random scale bits (zero, subnormal, inf, NaN)."""
    for K in K_CASES[name]:
        for data in (synthetic(name, N, K, seed=N + K), random_blocks(name, N, K, np.random.default_rng(K), scale_bits=True)):
            packed, r8 = _ops.repack(data.reshape(-1), CODE[name], N, K)
            assert r8 == _ops.r8_of(CODE[name]) == 256 + CODE[name]
            assert packed.size == -(-N // 8) * RECORD_BYTES[name] * (K // BS[name])
            with np.errstate(all="ignore"):
                want = ref_dequantize(data, GT[name]).reshape(N, K)
            assert bits_equal(_quant.dequantize(packed, r8, N, K), want), (name, N, K)


@pytest.mark.parametrize("name", BLOCK_TYPES)
@pytest.mark.parametrize("act", [0, 8, 16], ids=["f32", "int8", "int16"])
def test_products_on_repacked_weights_equal_stored(name, act, simd):
    """qw_matmul on the repacked matrix == on the stored one, bit for bit, for 1 to 40 rows of X
    (more than one pass of the kernels' 16 act rows) and a row count with a partial last group."""
    N = 21
    for K in K_CASES[name][-2:]:
        data = synthetic(name, N, K, seed=K).reshape(-1)
        packed, r8 = _ops.repack(data, CODE[name], N, K)
        bias = np.random.default_rng(K).standard_normal(N).astype(np.float32)
        for M in (1, 3, 17, 40):
            x = np.ascontiguousarray(act_inputs(K, np.random.default_rng(M))[np.arange(M) % 4]
                                     * np.float32(1 + np.arange(M)[:, None]))
            a = np.full((M, N), np.nan, np.float32)
            b = np.full((M, N), np.nan, np.float32)
            _ops.matmul(data, CODE[name], N, K, x, a, bias, act)
            _ops.matmul(packed, r8, N, K, x, b, bias, act)
            assert bits_equal(a, b), (name, act, K, M)
            assert np.isfinite(a).all()


@pytest.mark.parametrize("name", BLOCK_TYPES)
@pytest.mark.parametrize("bits", [8, 16])
def test_repacked_products_against_the_exact_dot(name, bits, simd):
    """The products over a repacked matrix (8 rows per unpacked block) against the float64 dot of
    the reference weights with the act rows' values, to float32 rounding."""
    N, K = 24, K_CASES[name][-1] * (4 if name in ("Q4_K", "Q5_K", "Q6_K") else 8)
    data = synthetic(name, N, K, seed=5)
    w = ref_dequantize(data, GT[name]).reshape(N, K)
    packed, r8 = _ops.repack(data.reshape(-1), CODE[name], N, K)
    x = np.ascontiguousarray(act_inputs(K, np.random.default_rng(6)))
    y = np.empty((4, N), np.float32)
    _ops.matmul(packed, r8, N, K, x, y, None, bits)
    xq = _quant.quantize_activations(x, CODE[name], bits=bits)
    for m in range(4):
        assert_int_dot_close(y[m], w, row_values(xq[m], K, bits), weight_mins(data, name, N, K))


@pytest.fixture(params=[1 << 20, 64 << 10], ids=["1MiB", "64KiB"])
def round_bytes(request):
    """Rounds of a known size (the default follows the core's L2): 1 MiB, the largest, and
    64 KiB, which cuts the prompt below into many rounds."""
    prev = _ops.act_round_bytes()
    _ops._set_act_round_bytes(request.param)
    yield request.param
    _ops._set_act_round_bytes(0)
    assert _ops.act_round_bytes() == prev


@pytest.mark.parametrize("name", BLOCK_TYPES)
@pytest.mark.parametrize("bits", [8, 16])
def test_long_prompts_go_through_the_act_rows_in_rounds(name, bits, simd, round_bytes):
    """A prompt's act rows beyond a round's bytes are multiplied round by round (all weight rows
    over one round's act rows, then the next round): with 1 MiB rounds 420 rows of K = 2048 make
    two 8-bit rounds and three 16-bit ones, the last shorter; with 64 KiB rounds, 14 of 32 rows
    and 27 of 16 rows (the last of 4). On the AMX paths, from 64 rows, a product whose rounds
    would hold fewer than 128 rows of all of K goes over K in passes instead (here 2 passes with
    1 MiB rounds of 16-bit rows on bf16 tiles, 4 to 8 with 64 KiB rounds), its sums kept between
    them. Every row equals, bit for bit, that row multiplied alone, on stored and
    repacked weights, in a group of two products sharing the act rows; rows of each round
    against the exact dot of the reference weights."""
    N, K, M = 21, 2048, 420
    data = [synthetic(name, N, K, seed=s).reshape(-1) for s in (1, 2)]
    packed = [_ops.repack(d, CODE[name], N, K) for d in data]
    bias = np.random.default_rng(3).standard_normal(N).astype(np.float32)
    x = np.ascontiguousarray(act_inputs(K, np.random.default_rng(4))[np.arange(M) % 4]
                             * np.float32(1 + (np.arange(M)[:, None] % 29)))
    for stored in (True, False):
        mats = [(d, CODE[name]) if stored else p for d, p in zip(data, packed)]
        outs = [np.full((M, N), np.nan, np.float32) for _ in mats]
        _ops.matmul_group([(w, dt, N, o, b) for (w, dt), o, b in zip(mats, outs, (bias, None))], x, bits)
        for (w, dt), o, b in zip(mats, outs, (bias, None)):
            assert np.isfinite(o).all(), (name, bits, stored)  # every round's rows written
            for m in (0, 15, 16, 143, 144, 200, 224, 287, 288, 401, M - 1):
                alone = np.full((1, N), np.nan, np.float32)
                _ops.matmul(w, dt, N, K, x[m:m + 1], alone, b, bits)
                assert bits_equal(o[m:m + 1], alone), (name, bits, stored, m)
            part = np.full((7, N), np.nan, np.float32)
            _ops.matmul(w, dt, N, K, x[M - 7:], part, b, bits)
            assert bits_equal(o[M - 7:], part)
    w = ref_dequantize(data[1].reshape(N, -1), GT[name]).reshape(N, K)
    xq = _quant.quantize_activations(x, CODE[name], bits=bits)
    for m in (0, 200, M - 1):
        assert_int_dot_close(outs[1][m], w, row_values(xq[m], K, bits), weight_mins(data[1].reshape(N, -1), name, N, K))


def test_repack_argument_checks():
    w = np.zeros(4 * 64 * 4, np.uint8)
    with pytest.raises(ValueError, match="no repacked layout"):
        _ops.repack(w, 0, 4, 64)  # F32
    with pytest.raises(ValueError, match="too small"):
        _ops.repack(w[:10], CODE["Q8_0"], 4, 64)
    with pytest.raises(ValueError, match="bad shape"):
        _ops.repack(w, CODE["Q8_0"], 4, 48)
    packed, r8 = _ops.repack(_quant.quantize_q8_0(np.ones((4, 64), np.float32)).reshape(-1), CODE["Q8_0"], 4, 64)
    with pytest.raises(ValueError, match="repacked"):
        _quant.dot_rows(packed, r8, 4, 64, np.ones(64, np.float32))
    with pytest.raises(ValueError, match="too small"):
        _ops.matmul(packed[:-1], r8, 4, 64, np.ones((1, 64), np.float32), np.empty((1, 4), np.float32))


@pytest.mark.parametrize("name", ["Q5_0", "Q8_0", "Q6_K"])
def test_piecewise_repack_of_a_mapped_matrix_is_the_whole(name, tmp_path):
    """Linear.repack builds a large matrix's copy a piece of rows at a time, releasing each
    piece's mapped pages: the result is byte for byte _ops.repack of the whole matrix, for a row
    count that is neither a multiple of the piece nor of 8, read from a real file mapping."""
    import mmap

    from qwenc.formats.tensors import Tensor
    from qwenc.model import weights as W
    N, K = 2 * W.REPACK_PIECE_ROWS + 13, 256
    data = synthetic(name, N, K, seed=7).reshape(-1)
    path = tmp_path / "w.bin"
    path.write_bytes(data.tobytes())
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = np.frombuffer(mm, np.uint8)
    lin = W.Linear(Tensor("w", CODE[name], (N, K), view, "test"))
    assert lin.repack()
    whole, r8 = _ops.repack(data, CODE[name], N, K)
    assert lin.packed.dtype == r8 and np.array_equal(lin.packed.data, whole)
    assert lin.weight.data is view  # a mapped original stays (its pages fault back in if read)
    np.testing.assert_array_equal(view, data)  # and still reads as the stored bytes
    del lin, view
    mm.close()


# ---------------------------------------------------------------- falsifiers

@pytest.mark.parametrize("name", ["Q5_0", "Q4_K", "Q6_K", "Q8_0"])
def test_falsifier_a_moved_code_is_caught(name):
    """One byte of the repacked codes changed: the values differ from the stored ones (the
    equality above can see a misplaced code)."""
    N, K = 8, 256
    data = synthetic(name, N, K, seed=3)
    packed, r8 = _ops.repack(data.reshape(-1), CODE[name], N, K)
    want = ref_dequantize(data, GT[name]).reshape(N, K)
    assert bits_equal(_quant.dequantize(packed, r8, N, K), want)
    bad = packed.copy()
    bad[-1] ^= 0x11  # a code byte of the last record (codes come last in every record)
    assert not bits_equal(_quant.dequantize(bad, r8, N, K), want)


@pytest.mark.parametrize("name", BLOCK_TYPES)
@pytest.mark.parametrize("bits", [8, 16])
def test_simd_paths_give_the_same_bits(name, bits):
    """Every SIMD path of this CPU (AVX2, AVX-512 on 256-bit vectors, AVX-512 with act rows in
    pairs on 512-bit ones) gives the same bits for any number of act rows, odd ones included:
    the block sums are exact integers on all of them and the float work after them the same. On
    an AVX2-only CPU this runs AVX2 twice (test_avx512.py checks the AVX-512 kernels there)."""
    paths = [p for p in _ops.simd_paths() if p != "plain"]
    paths = paths if len(paths) > 1 else paths * 2
    N, K = 13, K_CASES[name][-1]
    data = synthetic(name, N, K, seed=7).reshape(-1)
    packed, r8 = _ops.repack(data, CODE[name], N, K)
    x = np.ascontiguousarray(act_inputs(K, np.random.default_rng(8))[np.arange(40) % 4]
                             * np.float32(1 + np.arange(40)[:, None] % 7))
    prev = _ops.simd_path()
    try:
        for M in (1, 2, 3, 8, 16, 17, 40):  # 8 and 16: the kernels' constant row counts
            outs = {}
            for p in paths:
                _ops.set_simd_path(p)
                outs[p] = np.full((M, N), np.nan, np.float32)
                _ops.matmul(packed, r8, N, K, x[:M], outs[p], None, bits)
            for p in paths[1:]:
                assert bits_equal(outs[p], outs[paths[0]]), (name, bits, M, p)
    finally:
        _ops.set_simd_path(prev)


# ---------------------------------------------------------------- BF16's layout, for the float row kernel

def _bf16_codes(N, K, seed, specials=True):
    """N x K bf16 codes of random floats; with `specials`, zeros of both signs, infinities, a
    NaN and subnormals among them."""
    rng = np.random.default_rng(seed)
    codes = ((rng.standard_normal((N, K)) * 3).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    if specials:
        flat = codes.reshape(-1)
        some = np.array([0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC1, 0x0001, 0x8003], np.uint16)
        at = rng.choice(flat.size, min(flat.size, some.size), replace=False)
        flat[at] = some[:at.size]
    return codes


@pytest.mark.parametrize("N", [1, 3, 4, 8, 13, 29])
def test_bf16_repacked_values_are_the_stored_values(N):
    """Every row of the repacked BF16 matrix widens to the stored row's floats, bit for bit (a
    bf16 is a float32's high half), through the row reader and the embedding lookup alike; the
    last group's missing rows are padding."""
    for K in (8, 24, 200, 896):
        codes = _bf16_codes(N, K, N + K)
        packed, r8 = _ops.repack(codes.reshape(-1).view(np.uint8), BF16, N, K)
        assert r8 == _ops.r8_of(BF16) == 256 + BF16
        assert packed.size == -(-N // 8) * 8 * K * 2
        want = (codes.astype(np.uint32) << 16).view(np.float32)
        assert bits_equal(_quant.dequantize(packed, r8, N, K), want), (N, K)
        ids = np.array([0, N - 1, N // 2, 0], np.int32)  # a tied table's lookup reads the copy
        out = np.zeros((4, K), np.float32)
        _ops.embed(packed, r8, N, K, ids, out)
        assert bits_equal(out, want[ids]), (N, K)


def test_bf16_products_on_repacked_weights_equal_stored(simd):
    """qw_matmul on the repacked BF16 matrix == on the stored one, bit for bit: 1 and 2 act rows
    (the group row kernel), 3 to 40 (the widened tiles), each row alone the same as in the
    batch, 1 to 3 threads, with and without a bias, row counts with partial groups and halves."""
    prev = _ops.get_threads()
    try:
        for N, K in ((1, 8), (5, 64), (13, 200), (21, 896), (64, 8), (131, 1536)):
            data = _bf16_codes(N, K, N * K, specials=False).reshape(-1).view(np.uint8)
            packed, r8 = _ops.repack(data, BF16, N, K)
            rng = np.random.default_rng(N + K)
            bias = rng.standard_normal(N).astype(np.float32)
            for M in (1, 2, 3, 17, 40):
                x = rng.standard_normal((M, K)).astype(np.float32)
                for threads in (1, 2, 3):
                    _ops.set_threads(threads)
                    for b in (None, bias):
                        a = np.full((M, N), np.nan, np.float32)
                        c = np.full((M, N), np.nan, np.float32)
                        _ops.matmul(data, BF16, N, K, x, a, b)
                        _ops.matmul(packed, r8, N, K, x, c, b)
                        assert bits_equal(a, c), (N, K, M, threads)
                        for m in (0, M - 1):
                            one = np.full((1, N), np.nan, np.float32)
                            _ops.matmul(packed, r8, N, K, np.ascontiguousarray(x[m:m + 1]), one, b)
                            assert bits_equal(one[0], c[m]), (N, K, M, m, threads)
    finally:
        _ops.set_threads(prev)


def test_bf16_falsifier_a_moved_value_is_caught():
    """The product test above can fail: one value moved to its neighbour's place in the layout
    changes the products."""
    N, K = 13, 64
    data = _bf16_codes(N, K, 3, specials=False).reshape(-1).view(np.uint8)
    packed, r8 = _ops.repack(data, BF16, N, K)
    wrong = packed.copy().view(np.uint16)
    wrong[[0, 1]] = wrong[[1, 0]]
    x = np.random.default_rng(1).standard_normal((1, K)).astype(np.float32)
    a, c = np.zeros((1, N), np.float32), np.zeros((1, N), np.float32)
    _ops.matmul(data, BF16, N, K, x, a)
    _ops.matmul(wrong.view(np.uint8), r8, N, K, x, c)
    assert not bits_equal(a, c)


def test_bf16_rows_not_a_multiple_of_8_keep_the_stored_layout():
    assert _ops.repacks(BF16, 896) and _ops.repacks(BF16, 8)
    assert not _ops.repacks(BF16, 12) and not _ops.repacks(F32, 896)
    with pytest.raises(ValueError):
        _ops.repack(np.zeros(4 * 12 * 2, np.uint8), BF16, 4, 12)
