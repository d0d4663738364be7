"""The AVX-512 VNNI integer products (csrc/intdot_avx512.c), run on any CPU through SIMDe.

Both kinds: on 256-bit vectors, and the wide ones that take act rows two at a time in 512-bit
vectors (with a lone row, or the odd one out, on the 256-bit loop). Also the quantizer that
writes their pair rows straight from float rows (csrc/act_avx512.c).

The file is compiled here a second time, against SIMD Everywhere's portable implementations of
the AVX-512 intrinsics (QW_SIMDE; the `simde-py` package ships the headers), into a small
library with a test entry point (tests/avx512_harness.c). Its products on repacked weights must
equal the AVX2 path's bit for bit: the block sums are exact integers on both, and the float work
after them is the same. This checks the kernels' logic (layout, shifts, offsets, scales), not
their speed, nor the compiler's native AVX-512 code generation, which only an AVX-512 CPU runs.
"""
import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from qwenc import _ops, _quant
from test_quant import BLOCK_TYPES, CODE, act_inputs, synthetic

ROOT = Path(__file__).resolve().parent.parent
K_CASES = {name: ([32, 96, 160, 288] if name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0") else [256, 768])
           for name in BLOCK_TYPES}


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    import simde_py
    cc = os.environ.get("CC", "cc")
    out = tmp_path_factory.mktemp("avx512") / "libqw_avx512.so"
    # AVX2, FMA and F16C natively (the test compares against the AVX2 path, so the CPU has them):
    # SIMDe then emulates only the AVX-512 operations, and the FMAs stay fused, as on real hardware
    cmd = [cc, "-O1", "-std=c11", "-ffp-contract=off", "-fno-math-errno", "-Wno-psabi", "-DQW_SIMDE",
           "-mavx2", "-mfma", "-mf16c",
           f"-I{ROOT / 'csrc'}", f"-I{simde_py.get_include()}", "-fPIC", "-shared", "-o", str(out),
           str(ROOT / "csrc" / "intdot_avx512.c"), str(ROOT / "csrc" / "act_avx512.c"),
           str(ROOT / "tests" / "avx512_harness.c")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lib = ctypes.CDLL(str(out))
    lib.qw_test_r8_avx512.restype = ctypes.c_int
    lib.qw_test_r8_avx512.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int64,
                                      ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64, ctypes.c_void_p]
    lib.qw_test_r8_two_avx512.restype = ctypes.c_int
    lib.qw_test_r8_two_avx512.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                          ctypes.c_size_t, ctypes.c_int64, ctypes.c_void_p]
    lib.qw_quantize_pairs_avx512.restype = None
    lib.qw_quantize_pairs_avx512.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int64, ctypes.c_int,
                                             ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64, ctypes.c_int64]
    return lib


def pair_rows(xq, K, bits):
    """Act rows as the wide kernels take them (csrc/kernels.h), built here independently of
    qw_pair_act_rows: rows 2p and 2p + 1 interleaved 4 bytes at a time, an odd last row paired
    with itself, and each block's code-sum field holding what the code offsets take off,
    negated: for 8-bit rows the two 16-value sums, for 16-bit rows the joined (256 q1 + q2) sum
    of the low 16 values in level 1's field and of the whole block in level 2's."""
    nb = K // 32
    half = K + 8 * nb + 2 * (K // 16)
    rows = xq.copy()
    for x in rows:
        f = K + 8 * nb  # the code sums of level 1, then (16 bits) of level 2 one half on
        s1 = x[f:f + 4 * nb].view(np.int16).astype(np.int32).reshape(nb, 2)
        if bits == 8:
            x[f:f + 4 * nb] = (-s1).astype(np.int16).view(np.uint8).reshape(-1)
            continue
        s2 = x[half + f:half + f + 4 * nb].view(np.int16).astype(np.int32).reshape(nb, 2)
        joined = 256 * s1 + s2
        x[f:f + 4 * nb] = (-joined[:, 0]).astype(np.int32).view(np.uint8)
        x[half + f:half + f + 4 * nb] = (-joined.sum(axis=1)).astype(np.int32).view(np.uint8)
    return interleave_pairs(rows)


def interleave_pairs(xq):
    """Rows 2p and 2p + 1 interleaved 4 bytes at a time, an odd last row paired with itself."""
    rows = xq.view(np.uint32)
    if len(rows) % 2:
        rows = np.concatenate([rows, rows[-1:]])
    return np.ascontiguousarray(np.stack([rows[0::2], rows[1::2]], axis=2).reshape(len(rows) // 2, -1).view(np.uint8))


def avx512_product(lib, dtype, bits, group, K, xq, M, wide=False):
    out = np.full((M, 8), np.nan, np.float32)
    if wide:
        xq = pair_rows(xq, K, bits)
    rc = lib.qw_test_r8_avx512(dtype, bits, int(wide), group.ctypes.data, K, xq.ctypes.data, xq.shape[1], M,
                               out.ctypes.data)
    assert rc == 0
    return out


@pytest.fixture
def avx2():
    if not _ops.has_avx2():
        pytest.fail("the AVX-512 kernels are checked against the AVX2 ones, which this CPU cannot run")
    prev = _ops.set_simd_path("avx2"), _quant.set_simd_path("avx2")
    yield
    _ops.set_simd_path(prev[0])
    _quant.set_simd_path(prev[1])


@pytest.mark.skipif(sys.platform == "win32", reason="builds a shared library with the system C compiler")
@pytest.mark.parametrize("name", BLOCK_TYPES)
@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize("wide", [False, True], ids=["256", "512"])
def test_avx512_products_equal_avx2(lib, avx2, name, bits, wide):
    for K in K_CASES[name]:
        data = synthetic(name, 8, K, seed=K + bits).reshape(-1)
        packed, r8 = _ops.repack(data, CODE[name], 8, K)
        for M in (1, 2, 5, 8, 16):
            x = np.ascontiguousarray(act_inputs(K, np.random.default_rng(M))[np.arange(M) % 4]
                                     * np.float32(1 + np.arange(M)[:, None]))
            want = np.empty((M, 8), np.float32)
            _ops.matmul(packed, r8, 8, K, x, want, None, bits)
            xq = np.ascontiguousarray(_quant.quantize_activations(x, CODE[name], bits=bits))
            got = avx512_product(lib, CODE[name], bits, packed, K, xq, M, wide)
            assert np.isfinite(want).all()
            np.testing.assert_array_equal(got, want, err_msg=f"{name} int{bits} K={K} M={M} wide={wide}")


@pytest.mark.skipif(sys.platform == "win32", reason="builds a shared library with the system C compiler")
@pytest.mark.parametrize("wide", [False, True], ids=["256", "512"])
def test_falsifier_a_changed_code_is_seen(lib, avx2, wide):
    """The comparison above sees one code changed in the repacked weights."""
    K = 256
    data = synthetic("Q5_0", 8, K, seed=1).reshape(-1)
    packed, r8 = _ops.repack(data, CODE["Q5_0"], 8, K)
    x = np.ascontiguousarray(act_inputs(K, np.random.default_rng(2)))
    xq = np.ascontiguousarray(_quant.quantize_activations(x, CODE["Q5_0"]))
    want = np.empty((4, 8), np.float32)
    _ops.matmul(packed, r8, 8, K, x, want, None, 8)
    bad = packed.copy()
    bad[100] ^= 0x01  # a nibble of the first record's codes
    assert not np.array_equal(avx512_product(lib, CODE["Q5_0"], 8, bad, K, xq, 4, wide), want)
    np.testing.assert_array_equal(avx512_product(lib, CODE["Q5_0"], 8, packed, K, xq, 4, wide), want)


@pytest.mark.parametrize("bits", [8, 16])
def test_pair_act_rows_follow_the_layout(simd, bits):
    """qw_pair_act_rows, the plain reference of the pair rows, is byte for byte the layout the
    kernels are checked on above (pair_rows, written here from kernels.h's description), whatever
    the path set: row sizes of one block to many."""
    for K in (32, 96, 256, 288, 1184):
        for M in (1, 2, 5):
            x = np.ascontiguousarray(act_inputs(K, np.random.default_rng(K + M))[np.arange(M) % 4]
                                     * np.float32(1 + np.arange(M)[:, None]))
            xq = np.ascontiguousarray(_quant.quantize_activations(x, CODE["Q8_0"], bits=bits))
            np.testing.assert_array_equal(_quant.pair_activations(xq, K, bits), pair_rows(xq, K, bits),
                                          err_msg=f"K={K} M={M} int{bits}")


@pytest.mark.skipif(sys.platform == "win32", reason="builds a shared library with the system C compiler")
@pytest.mark.parametrize("name", ["Q4_0", "Q5_0", "Q8_0", "Q6_K"])
@pytest.mark.parametrize("bits", [8, 16])
def test_falsifier_pair_rows_without_offset_sums(lib, avx2, name, bits):
    """Pair rows merely interleaved (the plain rows' code sums left in place) give the offset
    types wrong products: the comparison above depends on the offset fields."""
    K = 256
    data = synthetic(name, 8, K, seed=3).reshape(-1)
    packed, r8 = _ops.repack(data, CODE[name], 8, K)
    x = np.ascontiguousarray(act_inputs(K, np.random.default_rng(4)))
    xq = np.ascontiguousarray(_quant.quantize_activations(x, CODE[name], bits=bits))
    want = np.empty((4, 8), np.float32)
    _ops.matmul(packed, r8, 8, K, x, want, None, bits)
    plain = interleave_pairs(xq)
    out = np.full((4, 8), np.nan, np.float32)
    assert lib.qw_test_r8_avx512(CODE[name], bits, 1, packed.ctypes.data, K, plain.ctypes.data,
                                 plain.shape[1], 4, out.ctypes.data) == 0
    assert not np.allclose(out, want, rtol=1e-3, atol=1e-3)
    np.testing.assert_array_equal(avx512_product(lib, CODE[name], bits, packed, K, xq, 4, True), want)


def fused_pair_rows(lib, x, bits, splits):
    """qw_quantize_pairs_avx512's pair rows of the float rows x (at most 16), written block range
    by block range (splits: the blocks where a call ends)."""
    rows, K = x.shape
    used = _quant.act_bytes(CODE["Q8_0"], K, bits)
    out = np.full(((rows + 1) // 2, 2 * used), 0xA5, np.uint8)
    b0 = 0
    for b1 in list(splits) + [K // 32]:
        lib.qw_quantize_pairs_avx512(x.ctypes.data, K, rows, K, bits, out.ctypes.data, out.shape[1], b0, b1)
        b0 = b1
    return out


def awkward_rows(K, rng):
    """16 float rows of K values with the act blocks that test the quantizer's cases (test_quant's
    awkward_act_rows where K has room for them: zeros, tiny and subnormal values, -0, ties, the
    level-2 clamp, +-inf and NaN), else act_inputs' four kinds."""
    from test_quant import awkward_act_rows
    if K >= 192:
        return np.ascontiguousarray(awkward_act_rows(K, rng)[[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 20, 21, 22, 34, 10, 11]])
    x = act_inputs(K, rng)[np.arange(16) % 4] * np.float32(1 + np.arange(16)[:, None])
    x[5, 3] = np.inf
    x[6, 0] = np.nan
    return np.ascontiguousarray(x)


@pytest.mark.skipif(sys.platform == "win32", reason="builds a shared library with the system C compiler")
@pytest.mark.parametrize("bits", [8, 16])
def test_fused_quantizer_writes_the_pair_rows(lib, bits):
    """The pair rows quantized straight from float rows (csrc/act_avx512.c, 16 rows a block) are
    byte for byte act.c's act rows of the same floats laid out as pair rows (pair_rows, written
    here from kernels.h's description): every row count from 1 to 16 (an odd last row paired with
    itself), awkward blocks included, the blocks in one call or in two or three ranges."""
    for K in (32, 96, 288, 1184):
        x = awkward_rows(K, np.random.default_rng(K + bits))
        nb = K // 32
        for rows in range(1, 17):
            xs = np.ascontiguousarray(x[:rows])
            want = pair_rows(_quant.quantize_activations(xs, CODE["Q8_0"], bits=bits), K, bits)
            for splits in ([], [nb // 2], [nb // 3, 2 * nb // 3]):
                np.testing.assert_array_equal(fused_pair_rows(lib, xs, bits, splits), want,
                                              err_msg=f"K={K} rows={rows} int{bits} splits={splits}")


@pytest.mark.skipif(sys.platform == "win32", reason="builds a shared library with the system C compiler")
@pytest.mark.parametrize("bits", [8, 16])
def test_falsifier_fused_quantizer_comparison_sees_one_code(lib, bits):
    """The comparison above sees one act value moved by its block's scale (its code and the
    block's sums change), and a range of blocks left out."""
    K, rows = 96, 5
    x = awkward_rows(K, np.random.default_rng(1))[:rows].copy()
    want = pair_rows(_quant.quantize_activations(x, CODE["Q8_0"], bits=bits), K, bits)
    moved = x.copy()
    moved[0, 40] += np.abs(moved[0, 32:64]).max() / np.float32(127)
    assert not np.array_equal(fused_pair_rows(lib, moved, bits, []), want)
    out = fused_pair_rows(lib, x, bits, [])
    np.testing.assert_array_equal(out, want)
    partial = np.full_like(out, 0xA5)
    lib.qw_quantize_pairs_avx512(x.ctypes.data, K, rows, K, bits, partial.ctypes.data, partial.shape[1], 0, 2)
    assert not np.array_equal(partial, want)


def two_group_product(lib, dtype, bits, packed, K, x, M):
    """The two-group pair kernel's outputs for 16 weight rows (two repacked groups) and M act rows,
    as [M, 16]; None where the type has no such kernel."""
    xq = pair_rows(np.ascontiguousarray(_quant.quantize_activations(x, dtype, bits=bits)), K, bits)
    out = np.full((2, M, 8), np.nan, np.float32)
    if lib.qw_test_r8_two_avx512(dtype, bits, packed.ctypes.data, K, xq.ctypes.data, xq.shape[1], M,
                                 out.ctypes.data) != 0:
        return None
    return out.transpose(1, 0, 2).reshape(M, 16)


@pytest.mark.skipif(sys.platform == "win32", reason="builds a shared library with the system C compiler")
@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_two_group_pair_kernels_equal_avx2(lib, avx2, name):
    """The pair kernels that take two groups (16 weight rows) per act broadcast (Q4_0 and Q5_0,
    16-bit rows, 8 or 16 act rows) give the AVX2 path's bits for all 16 rows; the other types and
    8-bit rows have none (the matmul then calls the one-group kernel)."""
    has = name in ("Q4_0", "Q5_0")
    for K in K_CASES[name]:
        data = synthetic(name, 16, K, seed=K + 21).reshape(-1)
        packed, r8 = _ops.repack(data, CODE[name], 16, K)
        for M in (8, 16):
            x = np.ascontiguousarray(act_inputs(K, np.random.default_rng(M + K))[np.arange(M) % 4]
                                     * np.float32(1 + np.arange(M)[:, None]))
            want = np.empty((M, 16), np.float32)
            _ops.matmul(packed, r8, 16, K, x, want, None, 16)
            got = two_group_product(lib, CODE[name], 16, packed, K, x, M)
            assert (got is not None) == has
            if has:
                np.testing.assert_array_equal(got, want, err_msg=f"{name} K={K} M={M}")
        assert two_group_product(lib, CODE[name], 8, packed, K, x, 16) is None


@pytest.mark.skipif(sys.platform == "win32", reason="builds a shared library with the system C compiler")
def test_falsifier_two_group_kernel_sees_the_second_group(lib, avx2):
    """The comparison above sees one code changed in the second group's weights."""
    K = 96
    data = synthetic("Q5_0", 16, K, seed=4).reshape(-1)
    packed, r8 = _ops.repack(data, CODE["Q5_0"], 16, K)
    x = np.ascontiguousarray(act_inputs(K, np.random.default_rng(3))[np.arange(16) % 4])
    want = np.empty((16, 16), np.float32)
    _ops.matmul(packed, r8, 16, K, x, want, None, 16)
    np.testing.assert_array_equal(two_group_product(lib, CODE["Q5_0"], 16, packed, K, x, 16), want)
    bad = packed.copy()
    bad[len(bad) // 2 + 100] ^= 0x01  # a code of the second group's first record
    got = two_group_product(lib, CODE["Q5_0"], 16, bad, K, x, 16)
    assert not np.array_equal(got[:, 8:], want[:, 8:])
    np.testing.assert_array_equal(got[:, :8], want[:, :8])
