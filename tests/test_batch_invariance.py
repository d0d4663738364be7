"""Batch invariance of the matrix products: a row's outputs are the same bits whatever else is in
the product.

The serving engine runs many sequences in one step, and caches KV blocks computed by prefill or
by decode steps of any batch: if a row's arithmetic depended on how many rows share the product
(a different kernel above some row count, a tiling that regroups sums), or on the thread count,
temperature-0 outputs would change with load. For every weight type and activation mode, on the
AVX2 and the plain C path, each row of a product of M rows must equal, bit for bit, the same row
computed alone (M = 1), for M from 1 to 512, with the row at any position among any other rows,
at 1 and 2 threads; group products (q/k/v, gate/up) likewise. Falsifiers show the comparison sees
a one-ulp change and a row computed with different arithmetic.
"""
import numpy as np
import pytest

from qwenc import _ops, _quant
from qwenc.formats.tensors import BF16, F16, F32
from test_quant import CODE, act_inputs, assert_dot_close, random_blocks, ref_dequantize, GT  # noqa: F401

BLOCK_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
FLOAT_TYPES = ["F32", "F16", "BF16"]
MODES = {"f32": 0, "int16": 16, "int8": 8}
ROW_COUNTS = [1, 2, 3, 4, 5, 8, 16, 17, 64]
N = 131            # not a multiple of the 4-row kernels, 32-row work items or any tile height


@pytest.fixture
def threads():
    """Restores the kernels' thread count after a test that changes it."""
    prev = _ops.get_threads()
    yield
    _ops.set_threads(prev)


def weights(name, K, seed):
    """(stored bytes, type code) of an N x K matrix of type `name`."""
    rng = np.random.default_rng(seed)
    if name in FLOAT_TYPES:
        w = rng.standard_normal((N, K)).astype(np.float32)
        if name == "F32":
            raw = w
        elif name == "F16":
            raw = w.astype(np.float16)
        else:
            raw = (w.view(np.uint32) >> 16).astype(np.uint16)
        return np.ascontiguousarray(raw).view(np.uint8).reshape(-1), CODE[name]
    return random_blocks(name, N, K, rng).reshape(-1), CODE[name]


def activations(M, K, seed):
    """M rows of the uneven kinds Qwen's activations have (outliers, zero blocks, tiny values),
    scaled differently per row so that no two rows are alike."""
    rng = np.random.default_rng(seed)
    base = act_inputs(K, rng)
    x = base[np.arange(M) % 4] * np.exp(rng.uniform(-2, 2, (M, 1))).astype(np.float32)
    x += (rng.standard_normal((M, K)) * 0.01).astype(np.float32)
    return np.ascontiguousarray(x, dtype=np.float32)


def product(W, dtype, K, X, bias, act):
    Y = np.full((X.shape[0], N), np.nan, np.float32)
    _ops.matmul(W, dtype, N, K, np.ascontiguousarray(X), Y, bias, act)
    return Y


def assert_rows_equal(got, want, what):
    """Bit-for-bit equality of float32 rows (NaN equal to NaN)."""
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    if not same.all():
        r, c = np.argwhere(~same)[0]
        raise AssertionError(f"{what}: {(~same).sum()} outputs differ; first row {r} col {c}: "
                             f"{got[r, c]!r} != {want[r, c]!r}")


def case_K(name):
    # k-quants need multiples of 256; the float types get a length with a tail of 5 (K % 8)
    return {"F32": 299, "F16": 301, "BF16": 517}.get(name, 512)


# ---------------------------------------------------------------- every type x mode

@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", FLOAT_TYPES + BLOCK_TYPES)
def test_each_row_independent_of_the_batch(name, mode, simd, threads):
    K = case_K(name)
    W, dtype = weights(name, K, seed=len(name) + K)
    act = MODES[mode]
    X = activations(max(ROW_COUNTS), K, seed=K)
    bias = np.random.default_rng(1).standard_normal(N).astype(np.float32)
    _ops.set_threads(1)
    alone = np.concatenate([product(W, dtype, K, X[m:m + 1], bias, act) for m in range(len(X))])
    assert np.isfinite(alone).all()
    for M in ROW_COUNTS:
        assert_rows_equal(product(W, dtype, K, X[:M], bias, act), alone[:M], f"{name} {mode} M={M}")
    # the same rows in another order, each among other neighbours
    perm = np.random.default_rng(2).permutation(len(X))
    assert_rows_equal(product(W, dtype, K, X[perm], bias, act), alone[perm], f"{name} {mode} permuted")
    # and at 2 threads
    _ops.set_threads(2)
    for M in (1, 5, 64):
        assert_rows_equal(product(W, dtype, K, X[:M], bias, act), alone[:M], f"{name} {mode} M={M}, 2 threads")


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", ["Q5_0", "Q8_0", "Q4_K", "Q6_K", "BF16"])
def test_prefill_sized_products(name, mode, simd, threads):
    """512 rows (a prefill chunk) against rows computed alone, at 2 threads."""
    K = case_K(name)
    W, dtype = weights(name, K, seed=3)
    act = MODES[mode]
    X = activations(512, K, seed=4)
    _ops.set_threads(2)
    big = product(W, dtype, K, X, None, act)
    for m in (0, 1, 2, 255, 383, 510, 511):
        assert_rows_equal(big[m:m + 1], product(W, dtype, K, X[m:m + 1], None, act), f"{name} {mode} row {m} of 512")


@pytest.mark.parametrize("mode", list(MODES))
def test_group_products_are_batch_invariant(mode, simd, threads):
    """q/k/v-style groups of mixed types: each output
    equals the single product of that row alone, whatever M."""
    K = 512
    mats = [weights(n, K, seed=i) for i, n in enumerate(["Q5_0", "Q8_0", "F32", "Q4_K", "BF16"])]
    rng = np.random.default_rng(5)
    biases = [rng.standard_normal(N).astype(np.float32), None, None, rng.standard_normal(N).astype(np.float32), None]
    act = MODES[mode]
    X = activations(33, K, seed=6)
    alone = [np.concatenate([product(W, dt, K, X[m:m + 1], b, act) for m in range(len(X))])
             for (W, dt), b in zip(mats, biases)]
    for t in (1, 2):
        _ops.set_threads(t)
        for count in (1, 2, 3, 4):
            for M in (1, 4, 5, 33):
                outs = [np.full((M, N), np.nan, np.float32) for _ in range(count)]
                _ops.matmul_group([(W, dt, N, o, b) for (W, dt), b, o in zip(mats, biases, outs)], X[:M], act)
                for i, o in enumerate(outs):
                    assert_rows_equal(o, alone[i][:M], f"{mode} group of {count}, matrix {i}, M={M}, {t} threads")


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("pair", [("Q5_0", "Q5_0"), ("Q4_K", "Q6_K"), ("Q8_0", "Q4_0"), ("Q4_K", "Q5_K")])
def test_swiglu_equals_group_then_silu(pair, mode, simd, threads):
    """An MLP's gate and up products joined by silu(gate) * up in one call (matmul_swiglu: on the
    AMX paths each work item takes both products' rows and the up outputs never reach memory)
    equal, bit for bit, matmul_group's two outputs joined by silu_mul, and each row equals that row
    computed alone: 1 to 48 rows (whole 16-row blocks, with and without a plain tail), 1 and 2
    threads, a bias on the gate, repacked and stored weights, and 131 rows of weights (not whole
    16-row pieces: the unfused path). Gate and up swapped give other outputs (the check can fail)."""
    K = 512
    act = MODES[mode]
    rng = np.random.default_rng(11)
    X = activations(48, K, seed=12)
    for n in (144, 131):
        stored = [(random_blocks(name, n, K, rng).reshape(-1), CODE[name]) for name in pair]
        variants = [stored]
        if n % 8 == 0:
            variants.append([_ops.repack(W, dt, n, K) for W, dt in stored])
        bias = rng.standard_normal(n).astype(np.float32)
        for (Wg, dg), (Wu, du) in variants:
            def swiglu(x, gate=(Wg, dg), up=(Wu, du)):
                got = np.full((len(x), n), np.nan, np.float32)
                _ops.matmul_swiglu((gate[0], gate[1], n, got, bias), (up[0], up[1], n, np.empty_like(got), None),
                                   np.ascontiguousarray(x), act)
                return got
            _ops.set_threads(1)
            alone = np.concatenate([swiglu(X[m:m + 1]) for m in range(len(X))])
            for t in (1, 2):
                _ops.set_threads(t)
                for M in (1, 5, 16, 17, 40, 48):
                    yg, yu = np.full((M, n), np.nan, np.float32), np.full((M, n), np.nan, np.float32)
                    _ops.matmul_group([(Wg, dg, n, yg, bias), (Wu, du, n, yu, None)], X[:M], act)
                    want = np.empty_like(yg)
                    _ops.silu_mul(yg.reshape(-1), yu.reshape(-1), want.reshape(-1))
                    got = swiglu(X[:M])
                    what = f"{pair} {mode} n={n} M={M} {t} threads"
                    assert_rows_equal(got, want, what)
                    assert_rows_equal(got, alone[:M], what + ", against rows alone")
            swapped = swiglu(X, gate=(Wu, du), up=(Wg, dg))
            assert not np.array_equal(swapped, alone)


# ---------------------------------------------------------------- which arithmetic each row gets

@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_integer_modes_use_integer_dots_for_every_row(name, bits, simd):
    """In the int modes prefill's rows get decode's integer arithmetic: every row of a 64-row
    product is the integer row kernel's result, bit for bit (so KV blocks computed by prefill or
    by decode hold the same values)."""
    K = 512
    W, dtype = weights(name, K, seed=7)
    X = activations(64, K, seed=8)
    Y = product(W, dtype, K, X, None, bits)
    xq = _quant.quantize_activations(X, dtype, bits=bits)
    rows = W.reshape(N, -1)
    want = np.stack([_quant.dot_rows_act(rows, dtype, N, K, xq[m], bits=bits) for m in range(len(X))])
    assert_rows_equal(Y, want, f"{name} int{bits}")


@pytest.mark.parametrize("name", FLOAT_TYPES + BLOCK_TYPES)
def test_f32_mode_rows_are_the_row_kernel(name, simd):
    """In the f32 mode every row of a product is the fused row kernel's float dot, bit for bit,
    and within float rounding of numpy's float64 product of the widened weights."""
    K = case_K(name)
    W, dtype = weights(name, K, seed=9)
    X = activations(40, K, seed=10)
    Y = product(W, dtype, K, X, None, 0)
    rows = W.reshape(N, -1)
    want = np.stack([_quant.dot_rows(rows, dtype, N, K, X[m]) for m in range(len(X))])
    assert_rows_equal(Y, want, f"{name} f32")
    wf = _quant.dequantize(rows, dtype, N, K)
    for m in range(len(X)):
        assert_dot_close(Y[m], wf, X[m])


# ---------------------------------------------------------------- out of memory

@pytest.mark.parametrize("name,act", [("Q8_0", 8), ("Q8_0", 16), ("F32", 0)])
def test_failed_allocation_raises_memory_error(name, act, threads):
    """A scratch buffer that cannot be allocated is a MemoryError, never a silently unwritten
    output; the next call, with memory again, computes the right result. The row is longer than
    any other test's, so the kernels' buffers must grow for it."""
    K, n = 1 << 21, 4
    rng = np.random.default_rng(11)
    w = rng.standard_normal((n, K)).astype(np.float32)
    W = (_quant.quantize_q8_0(w) if name == "Q8_0" else w.view(np.uint8)).reshape(-1)
    x = rng.standard_normal((1, K)).astype(np.float32)
    y = np.empty((1, n), np.float32)
    for t in (1, 2):
        _ops.set_threads(t)
        _ops._fail_allocations(1)
        try:
            with pytest.raises(MemoryError):
                _ops.matmul(W, CODE[name], n, K, x, y, None, act)
        finally:
            _ops._fail_allocations(0)
    _ops.matmul(W, CODE[name], n, K, x, y, None, act)
    want = _quant.dot_rows(W.reshape(n, -1), CODE[name], n, K, x[0]) if act == 0 else \
        _quant.dot_rows_act(W.reshape(n, -1), CODE[name], n, K, _quant.quantize_activations(x, CODE[name], bits=act)[0],
                            bits=act)
    assert_rows_equal(y, want[None], "after the failure")
    if act:  # and a group product, whose 3 act rows need a larger buffer again
        _ops._fail_allocations(1)
        try:
            with pytest.raises(MemoryError):
                _ops.matmul_group([(W, CODE[name], n, np.empty((3, n), np.float32), None)],
                                  np.ascontiguousarray(np.tile(x, (3, 1))), act)
        finally:
            _ops._fail_allocations(0)


# ---------------------------------------------------------------- falsifiers

def test_falsifier_one_ulp_is_seen():
    a = np.random.default_rng(12).standard_normal((3, 5)).astype(np.float32)
    b = a.copy()
    b[1, 2] = np.nextafter(b[1, 2], np.float32(np.inf))
    with pytest.raises(AssertionError, match="1 outputs differ"):
        assert_rows_equal(b, a, "one ulp")


def test_falsifier_other_arithmetic_is_seen():
    """A row computed with the other arithmetic (f32 vs int16, the closest pair) differs: the
    invariance check would catch a path switching arithmetic above some row count."""
    K = 512
    W, dtype = weights("Q5_0", K, seed=13)
    X = activations(8, K, seed=14)
    with pytest.raises(AssertionError):
        assert_rows_equal(product(W, dtype, K, X, None, 16), product(W, dtype, K, X, None, 0), "int16 vs f32")


@pytest.mark.parametrize("name", BLOCK_TYPES + FLOAT_TYPES)
def test_f32_decode_kernels_on_odd_sizes(name, simd):
    """Decode's fused f32 row kernels (4 rows at a time, then single rows) on 1, 3, 5 and 9 blocks
    per row and 1 to 7 rows: every output is the row kernel's dot, bit for bit, and within float
    rounding of numpy's."""
    for K in ([256, 768] if name.endswith("_K") else [32, 96, 160, 288, 8, 13] if name in FLOAT_TYPES
              else [32, 96, 160, 288]):
        for n in (1, 3, 7):
            rng = np.random.default_rng(K + n)
            if name in FLOAT_TYPES:
                w = rng.standard_normal((n, K)).astype(np.float32)
                raw = {"F32": w, "F16": w.astype(np.float16), "BF16": (w.view(np.uint32) >> 16).astype(np.uint16)}[name]
                W = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
            else:
                W = random_blocks(name, n, K, rng).reshape(-1)
            x = rng.standard_normal((2, K)).astype(np.float32)
            for M in (1, 2):
                y = np.empty((M, n), np.float32)
                _ops.matmul(W, CODE[name], n, K, x[:M], y, None, 0)
                rows = W.reshape(n, -1)
                for m in range(M):
                    assert_rows_equal(y[m:m + 1], _quant.dot_rows(rows, CODE[name], n, K, x[m])[None], f"{name} K={K} n={n}")
                    assert_dot_close(y[m], _quant.dequantize(rows, CODE[name], n, K), x[m])
