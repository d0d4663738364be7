# cython: language_level=3
"""Python face of the model kernels in csrc/ (matmul, norms, RoPE, attention, sampling).

Arguments are typed memoryviews, so shapes and dtypes are checked by Cython at the call; the C
kernels run without the GIL. These wrappers check shapes only where a mismatch would make C read
or write out of bounds.
"""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint64_t
from libc.stdlib cimport calloc, free

import numpy as np


cdef extern from "cpu.h":
    int qw_use_avx2() nogil
    int qw_cpu_has_avx2() nogil
    int qw_set_simd(int enabled) nogil
    int qw_simd_level() nogil
    int qw_cpu_simd_level() nogil
    int qw_default_simd_level() nogil
    int qw_set_simd_level(int level) nogil
    int qw_get_threads() nogil
    void qw_set_threads(int n) nogil
    int qw_parallel_width() nogil
    void qw_fail_allocs(int n) nogil

cdef extern from "quant.h":
    int qw_dtype_supported(int dtype) nogil
    size_t qw_row_bytes(int dtype, int64_t n) nogil
    size_t qw_matrix_bytes(int dtype, int64_t N, int64_t K) nogil
    int qw_block_size(int dtype) nogil
    int qw_r8_of(int dtype) nogil
    void qw_repack_r8(int dtype, const void *src, int64_t N, int64_t K, void *dst) nogil

cdef extern from "matmul.h":
    int qw_matmul(const void *W, int dtype, int64_t N, int64_t K, const float *X, int64_t M, float *Y,
                  const float *bias, int act) nogil
    ctypedef struct qw_product:
        const void *W
        int dtype
        int64_t N
        float *Y
        const float *bias
    int qw_matmul_group(const qw_product *p, int count, int64_t K, const float *X, int64_t M, int act) nogil
    int qw_matmul_swiglu(const qw_product *p, int64_t K, const float *X, int64_t M, int act) nogil
    size_t qw_act_round_bytes() nogil
    int qw_vertical_pays(int64_t M) nogil
    void qw_set_act_round_bytes(size_t bytes) nogil

cdef extern from "moe.h":
    ctypedef struct qw_moe:
        int64_t hidden, n_experts, top_k, inter
        int norm_topk
        qw_product router
        const qw_product *experts
        const qw_product *shared
        int64_t shared_inter
        qw_product shared_gate
    size_t qw_moe_scratch_bytes(const qw_moe *m, int64_t T) nogil
    int qw_moe_mlp(const qw_moe *m, const float *h, int64_t T, int act, void *scratch, float *out) nogil
    void qw_moe_route(float *logits, int64_t T, int64_t n_experts, int64_t top_k, int norm_topk, int32_t *top,
                      float *weight) nogil

cdef extern from "ops.h":
    void qw_rmsnorm(const float *x, const float *w, float eps, int64_t M, int64_t D, float *out) nogil
    void qw_rope_table(int64_t T, int64_t hd, const int64_t *pos, const float *inv_freq, float mscale, float *cs) nogil
    void qw_rope_apply(float *x, int64_t T, int64_t H, int64_t hd, const float *cs) nogil
    void qw_silu_mul(const float *gate, const float *up, int64_t n, float *out) nogil
    void qw_softmax(float *x, int64_t M, int64_t n) nogil
    int qw_embed(const void *E, int dtype, int64_t D, const int32_t *ids, int64_t T, float *out) nogil

cdef extern from "probe.h":
    uint64_t qw_read_sum(const uint64_t *p, int64_t n_words) nogil
    uint64_t qw_dot_peak(int64_t rounds) nogil
    uint64_t qw_dot_peak_mix(int64_t rounds, int fp) nogil
    uint64_t qw_dot_peak_words(int64_t rounds) nogil
    int QW_PEAK_MAX_FP

cdef extern from "attention.h":
    enum:
        QW_KV_F32
        QW_KV_F16
    void qw_kv_write(const float *k, const float *v, int64_t T, int64_t n_kv_heads, int64_t hd,
                     const int64_t *slots, int64_t n_blocks, int64_t bs, int kv_type, void *Kc, void *Vc) nogil
    int qw_paged_attention(const float *q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t hd,
                           int kv_type, const void *Kc, const void *Vc, int64_t n_blocks, int64_t bs,
                           const int32_t *block_tables,
                           int64_t max_blocks, const int32_t *row_seq, const int64_t *row_pos, float scale,
                           float *out) nogil

cdef extern from "forward.h":
    ctypedef struct qw_layer:
        const float *attn_norm
        const float *mlp_norm
        const float *q_norm
        const float *k_norm
        qw_product qkv[3]
        qw_product o
        qw_product gate_up[2]
        qw_product down
        const qw_moe *moe
        void *Kc
        void *Vc
    ctypedef struct qw_stack:
        int64_t hidden, heads, kv_heads, head_dim, inter
        float eps, scale
        const float *inv_freq
        float rope_mscale
        int act, kv_type
        int64_t n_blocks, bs
        float *x
        float *h
        float *q
        float *k
        float *v
        float *attn
        float *o
        float *gate
        float *up
        float *rope
        void *moe_scratch
    int qw_forward_layers(const qw_stack *s, const qw_layer *layers, int n, int64_t T, const int64_t *pos,
                          const int64_t *slots, const int32_t *block_tables, int64_t max_blocks,
                          const int32_t *row_seq) nogil

cdef extern from "sample.h":
    int64_t qw_argmax(const float *x, int64_t n) nogil
    int64_t qw_sample(float *logits, int64_t n, float temperature, int64_t top_k, float top_p, float min_p,
                      double u, int32_t *idx, float *val) nogil
    int64_t QW_SAMPLE_NOMEM
    void qw_sample_fail_allocs(int n) nogil


# ---------------------------------------------------------------- settings

def has_avx2():
    """True when the CPU has AVX2, FMA and F16C."""
    return bool(qw_cpu_has_avx2())


def simd_enabled():
    return bool(qw_use_avx2())


def set_simd(bint enabled):
    """Turn the SIMD paths on or off (for tests of the plain C path); returns the old setting."""
    return bool(qw_set_simd(enabled))


def get_threads():
    return qw_get_threads()


def set_threads(int n):
    qw_set_threads(n)


def parallel_width():
    """Threads the kernels' parallel regions get when run from the calling thread."""
    return qw_parallel_width()


def act_round_bytes():
    """Bytes of act rows per round of the integer products (a long prompt's rows go through
    every weight row one round at a time): an eighth of the core's L2 where that is under 2 MiB,
    else 1 MiB."""
    return qw_act_round_bytes()


def takes_vertical(int64_t M):
    """Whether a 16-bit product of M act rows runs on vertical blocks of joined rows (the AVX2
    path's vpmaddwd kernels) rather than the two-level ones: same bits, chosen for speed."""
    return bool(qw_vertical_pays(M))


def _set_act_round_bytes(size_t n):
    """Rounds of n bytes of act rows (0: the default again); for tests that need a known size."""
    qw_set_act_round_bytes(n)


def _fail_allocations(int n):
    """Make the kernels' next n scratch allocations fail (tests of the out-of-memory paths)."""
    qw_fail_allocs(n)


# ---------------------------------------------------------------- linear algebra

ACTIVATIONS = {"f32": 0, "int16": 16, "int8": 8}  # matmul.h's QW_ACT_* codes


cdef _check_product(const uint8_t[::1] W, int dtype, int64_t N, int64_t K, int64_t M, float[:, ::1] Y,
                    const float[::1] bias):
    _check_weight(W, dtype, N, K, bias)
    if Y.shape[0] != M or Y.shape[1] != N:
        raise ValueError(f"shape mismatch: X {M}x{K}, W {N}x{K}, Y {Y.shape[0]}x{Y.shape[1]}")


cdef _check_weight(const uint8_t[::1] W, int dtype, int64_t N, int64_t K, const float[::1] bias):
    if not qw_dtype_supported(dtype):
        raise ValueError(f"unsupported weight type {dtype}")
    if K % qw_block_size(dtype) != 0:
        raise ValueError(f"row length {K} is not a multiple of the block size {qw_block_size(dtype)}")
    if <size_t>W.shape[0] < qw_matrix_bytes(dtype, N, K):
        raise ValueError("weight buffer too small for its shape")
    if bias is not None and bias.shape[0] != N:
        raise ValueError("bias length differs from the output size")


def _check_act(int act):
    if act not in (0, 8, 16):
        raise ValueError(f"unknown activation code {act}")


def r8_of(int dtype):
    """The type code of `dtype`'s row-interleaved layout (quant.h: the integer path's, and BF16's
    for the float row kernel), or 0 when the type has none."""
    return qw_r8_of(dtype)


def repacks(int dtype, int64_t K):
    """Whether rows of K values of stored type `dtype` have a repacked layout (r8_of)."""
    cdef int r8 = qw_r8_of(dtype)
    return r8 != 0 and K > 0 and K % qw_block_size(dtype) == 0 and K % qw_block_size(r8) == 0


def matrix_bytes(int dtype, int64_t N, int64_t K):
    """Bytes of an N x K matrix of type `dtype` (a stored type or a repacked one)."""
    return qw_matrix_bytes(dtype, N, K)


def repack(const uint8_t[::1] W, int dtype, int64_t N, int64_t K, out=None):
    """The N x K matrix W of stored type `dtype` in its row-interleaved layout: (uint8 array,
    type code). The same values: every product on it gives what it gives on W, faster on the
    integer path (one unpacked block serves 8 rows and every activation row). `out`: a uint8
    buffer of matrix_bytes(r8_of(dtype), N, K) to write it into (returned) instead of a new one;
    with N a multiple of 8, a matrix's row ranges repack into consecutive slices of its layout."""
    cdef int r8 = qw_r8_of(dtype)
    if not r8:
        raise ValueError(f"type {dtype} has no repacked layout")
    if K <= 0 or N < 0 or K % qw_block_size(dtype) or K % qw_block_size(r8):
        raise ValueError(f"bad shape [{N}, {K}] for type {dtype}")
    if <size_t>W.shape[0] < qw_matrix_bytes(dtype, N, K):
        raise ValueError("weight buffer too small for its shape")
    if out is None:
        out = np.empty(qw_matrix_bytes(r8, N, K), np.uint8)
    cdef uint8_t[::1] o = out
    if <size_t>o.shape[0] != qw_matrix_bytes(r8, N, K):
        raise ValueError("output buffer is not the repacked matrix's size")
    if N > 0:
        with nogil:
            qw_repack_r8(dtype, &W[0], N, K, &o[0])
    return out, r8


def matmul(const uint8_t[::1] W, int dtype, int64_t N, int64_t K, const float[:, ::1] X,
           float[:, ::1] Y, const float[::1] bias=None, int act=0):
    """Y[M, N] = X[M, K] @ W.T (+ bias), W being N stored rows of K elements of type dtype.

    act: a code of ACTIVATIONS: float activations, or 16-bit or 8-bit act rows and integer dots
    over block-quantized weights (see matmul.h). Each row of Y depends on its own row of X only
    (batch invariance), whatever M and the thread count."""
    cdef int64_t M = X.shape[0]
    _check_act(act)
    if X.shape[1] != K:
        raise ValueError(f"shape mismatch: X {X.shape[0]}x{X.shape[1]}, W {N}x{K}")
    _check_product(W, dtype, N, K, M, Y, bias)
    cdef const float *b = &bias[0] if bias is not None else NULL
    cdef int rc
    if M == 0:
        return
    with nogil:
        rc = qw_matmul(&W[0], dtype, N, K, &X[0, 0], M, &Y[0, 0], b, act)
    if rc != 0:
        raise MemoryError("matmul: out of memory for its scratch buffers")


cdef _weight(qw_product *p, object prod, int64_t N, int64_t K, str name):
    """p from a (W, dtype, N, Y, bias) product of W [N, K] whose output the kernel places (Y is
    not read)."""
    cdef const uint8_t[::1] w
    cdef const float[::1] b
    W, dtype, n, _, bias = prod
    if n != N:
        raise ValueError(f"{name} has {n} rows, needs {N}")
    w, b = W, bias
    _check_weight(w, dtype, N, K, b)
    p.W = &w[0]
    p.dtype = dtype
    p.N = N
    p.Y = NULL
    p.bias = &b[0] if b is not None else NULL


cdef _fill_product(qw_product *p, object prod, int64_t K, int64_t M):
    """p from a (W, dtype, N, Y, bias) product of an [M, K] X, its shapes checked (Y NULL when
    M is 0)."""
    cdef float[:, ::1] y = prod[3]
    _weight(p, prod, prod[2], K, "the product")
    if y.shape[0] != M or y.shape[1] != p.N:
        raise ValueError(f"shape mismatch: X {M}x{K}, W {p.N}x{K}, Y {y.shape[0]}x{y.shape[1]}")
    p.Y = &y[0, 0] if M > 0 else NULL


def matmul_group(products, const float[:, ::1] X, int act=0):
    """For each (W, dtype, N, Y, bias) in products: Y[M, N] = X @ W.T (+ bias), every W with
    X's row length, as one parallel pass over all the matrices' rows (a layer's q, k, v; gate,
    up), each output exactly as matmul computes it."""
    cdef int64_t M = X.shape[0], K = X.shape[1]
    cdef qw_product p[4]
    cdef int i, rc, count = len(products)
    _check_act(act)
    if count < 1 or count > 4:
        raise ValueError(f"a group holds 1 to 4 products, got {count}")
    for i in range(count):
        _fill_product(&p[i], products[i], K, M)
    if M == 0:
        return
    with nogil:
        rc = qw_matmul_group(p, count, K, &X[0, 0], M, act)
    if rc != 0:
        raise MemoryError("matmul_group: out of memory for its scratch buffers")


def matmul_swiglu(gate, up, const float[:, ::1] X, int act=0):
    """An MLP's gate and up products, (W, dtype, N, Y, bias) each: gate's Y = silu(X @ Wg.T + bg) *
    (X @ Wu.T + bu), as matmul_group and silu_mul give it bit for bit; up's Y is scratch."""
    cdef int64_t M = X.shape[0], K = X.shape[1]
    cdef qw_product p[2]
    cdef int rc
    _check_act(act)
    _fill_product(&p[0], gate, K, M)
    _fill_product(&p[1], up, K, M)
    if p[0].N != p[1].N:
        raise ValueError(f"gate and up differ in rows: {p[0].N} and {p[1].N}")
    if M == 0:
        return
    with nogil:
        rc = qw_matmul_swiglu(p, K, &X[0, 0], M, act)
    if rc != 0:
        raise MemoryError("matmul_swiglu: out of memory for its scratch buffers")


def embed(const uint8_t[::1] E, int dtype, int64_t V, int64_t D, const int32_t[::1] ids, float[:, ::1] out):
    """out[t] = row ids[t] of the stored embedding table E (V rows of D)."""
    cdef int64_t T = ids.shape[0], t
    cdef int rc
    if not qw_dtype_supported(dtype):
        raise ValueError(f"unsupported embedding type {dtype}")
    if D % qw_block_size(dtype) != 0:
        raise ValueError(f"row length {D} is not a multiple of the block size {qw_block_size(dtype)}")
    if out.shape[0] != T or out.shape[1] != D:
        raise ValueError("output shape mismatch")
    if <size_t>E.shape[0] < qw_row_bytes(dtype, D) * V:
        raise ValueError("embedding buffer too small for its shape")
    for t in range(T):
        if ids[t] < 0 or ids[t] >= V:
            raise ValueError(f"token id {ids[t]} outside the vocabulary (0..{V - 1})")
    if T == 0:
        return
    with nogil:
        rc = qw_embed(&E[0], dtype, D, &ids[0], T, &out[0, 0])
    if rc != 0:
        raise ValueError(f"embedding type {dtype} with rows of {D} has no kernel")


# ---------------------------------------------------------------- element-wise

def read_sum(const uint64_t[::1] words):
    """The wrapping sum of the words, read by all the kernels' threads (a bandwidth probe)."""
    cdef uint64_t r
    with nogil:
        r = qw_read_sum(&words[0], words.shape[0])
    return int(r)


def dot_peak(int64_t rounds):
    """Byte multiply-adds done by `rounds` rounds of the current path's integer multiply-add
    instruction on every kernel thread (probe.h): time it for the machine's integer peak."""
    cdef uint64_t r
    if rounds < 0:
        raise ValueError("rounds must be >= 0")
    with nogil:
        r = qw_dot_peak(rounds)
    return int(r)


def dot_peak_words(int64_t rounds):
    """16-bit multiply-adds done by `rounds` rounds of 24 AVX2 vpmaddwd (each with the add that
    accumulates it) in register chains on every kernel thread (probe.h): time it for the rate of
    the joined 16-bit kernels' instruction alone. The AVX2 and wider paths only."""
    cdef uint64_t r
    if rounds < 0:
        raise ValueError("rounds must be >= 0")
    with nogil:
        r = qw_dot_peak_words(rounds)
    if r == 0:  # probe.h: every run does products, except where the path has no AVX2
        raise ValueError(f"the 16-bit probe runs on AVX2 paths, not on {simd_path()!r}")
    return int(r)


def dot_peak_mix(int64_t rounds, int fp):
    """Byte multiply-adds done by `rounds` rounds of 16 512-bit vpdpbusd with `fp` (0-8) 512-bit
    float FMAs among them, on every kernel thread (probe.h): time it for the ceiling of a kernel
    mixing that much float work into its products. The 512-bit paths only."""
    cdef uint64_t r
    if rounds < 0:
        raise ValueError("rounds must be >= 0")
    if fp < 0 or fp > QW_PEAK_MAX_FP:
        raise ValueError(f"fp must be in 0..{QW_PEAK_MAX_FP}, got {fp}")
    with nogil:
        r = qw_dot_peak_mix(rounds, fp)
    if r == 0:  # probe.h: every run does products, except where the path is not a 512-bit one
        raise ValueError(f"the mixed probe runs on the 512-bit paths, not on {simd_path()!r}")
    return int(r)


def rmsnorm(const float[:, ::1] x, const float[::1] w, float eps, float[:, ::1] out):
    cdef int64_t M = x.shape[0], D = x.shape[1]
    if w.shape[0] != D or out.shape[0] != M or out.shape[1] != D:
        raise ValueError("rmsnorm shape mismatch")
    if M == 0:
        return
    with nogil:
        qw_rmsnorm(&x[0, 0], &w[0], eps, M, D, &out[0, 0])


def rope(float[:, :, ::1] x, const int64_t[::1] pos, const float[::1] inv_freq, float mscale=1.0):
    """Rotate x[T, H, hd] in place for positions pos[T] (pairs i and i + hd/2), cos and sin
    times mscale."""
    cdef int64_t T = x.shape[0], H = x.shape[1], hd = x.shape[2]
    if pos.shape[0] != T or inv_freq.shape[0] != hd // 2 or hd % 2:
        raise ValueError("rope shape mismatch")
    if T == 0:
        return
    cdef float[:, ::1] cs = np.empty((T, hd), np.float32)
    with nogil:
        qw_rope_table(T, hd, &pos[0], &inv_freq[0], mscale, &cs[0, 0])
        qw_rope_apply(&x[0, 0, 0], T, H, hd, &cs[0, 0])


def silu_mul(const float[::1] gate, const float[::1] up, float[::1] out):
    cdef int64_t n = gate.shape[0]
    if up.shape[0] != n or out.shape[0] != n:
        raise ValueError("silu_mul shape mismatch")
    if n == 0:
        return
    with nogil:
        qw_silu_mul(&gate[0], &up[0], n, &out[0])


def softmax(float[:, ::1] x):
    """Row-wise softmax in place."""
    if x.shape[0] == 0 or x.shape[1] == 0:
        return
    with nogil:
        qw_softmax(&x[0, 0], x.shape[0], x.shape[1])


# ---------------------------------------------------------------- attention

KV_DTYPES = {"f32": np.float32, "f16": np.float16}  # what a KV pool may hold (attention.h's QW_KV_*)


cdef void *_pool(object a, int64_t *shape, int *kv_type) except NULL:
    """A KV pool's data pointer, its shape and QW_KV_* type: a C-contiguous 4-d float32 or
    float16 array (float16 read through its bits)."""
    cdef float[:, :, :, ::1] f
    cdef uint16_t[:, :, :, ::1] h
    cdef Py_ssize_t *dims
    cdef int i
    if getattr(a, "dtype", None) == np.float16:
        h = a.view(np.uint16)
        kv_type[0], dims = QW_KV_F16, h.shape
    else:
        f = a
        kv_type[0], dims = QW_KV_F32, f.shape
    for i in range(4):
        if dims[i] == 0:
            raise ValueError("empty KV pool")
        shape[i] = dims[i]
    return &h[0, 0, 0, 0] if kv_type[0] == QW_KV_F16 else &f[0, 0, 0, 0]


cdef int _pools(object Kc, object Vc, void **kp, void **vp, int64_t *shape) except -1:
    """Both pools of a layer, of one type: keys [Hkv, n_blocks, hd, bs] (each block's keys
    stored transposed, a key down a column) and values [Hkv, n_blocks, bs, hd]. Fills the
    pointers and (n_blocks, Hkv, bs, hd); returns the QW_KV_* type."""
    cdef int64_t kshape[4]
    cdef int64_t vshape[4]
    cdef int ktype, vtype
    kp[0] = _pool(Kc, kshape, &ktype)
    vp[0] = _pool(Vc, vshape, &vtype)
    if (vtype != ktype or kshape[0] != vshape[0] or kshape[1] != vshape[1] or kshape[2] != vshape[3]
            or kshape[3] != vshape[2]):
        raise ValueError("K and V pools differ in dtype or shape (keys [Hkv, n_blocks, hd, bs], "
                         "values [Hkv, n_blocks, bs, hd])")
    shape[0], shape[1], shape[2], shape[3] = vshape[1], vshape[0], vshape[2], vshape[3]
    return ktype


cdef _check_slots(const int64_t[::1] slots, int64_t nb, int64_t bs):
    """Every new key's slot lies in the pool of nb blocks of bs positions."""
    cdef int64_t t
    for t in range(slots.shape[0]):
        if slots[t] < 0 or slots[t] >= nb * bs:
            raise ValueError(f"slot {slots[t]} outside the pool of {nb} blocks of {bs}")


def kv_write(const float[:, :, ::1] k, const float[:, :, ::1] v, const int64_t[::1] slots, Kc, Vc):
    """Store k, v [T, Hkv, hd] of T new tokens into slots (block * bs + offset) of the pools
    Kc [Hkv, n_blocks, hd, bs] and Vc [Hkv, n_blocks, bs, hd] (float32, or float16: rounded to
    nearest even)."""
    cdef int64_t T = k.shape[0], Hkv = k.shape[1], hd = k.shape[2]
    cdef int64_t shape[4]
    cdef void *kp
    cdef void *vp
    cdef int kv_type = _pools(Kc, Vc, &kp, &vp, shape)
    cdef int64_t nb = shape[0], bs = shape[2]
    if v.shape[0] != T or v.shape[1] != Hkv or v.shape[2] != hd or slots.shape[0] != T:
        raise ValueError("kv_write shape mismatch")
    if shape[1] != Hkv or shape[3] != hd:
        raise ValueError("kv_write pool shape mismatch")
    _check_slots(slots, nb, bs)
    if T == 0:
        return
    with nogil:
        qw_kv_write(&k[0, 0, 0], &v[0, 0, 0], T, Hkv, hd, &slots[0], nb, bs, kv_type, kp, vp)


cdef _check_rows(const int32_t[::1] row_seq, const int64_t[::1] row_pos, const int32_t[:, ::1] block_tables,
                 int64_t bs, int64_t nb):
    """Every row's sequence is a row of block_tables, and every block up to its position's is a
    block of the pool (0 .. nb - 1), so attention reads nothing outside the pools."""
    cdef int64_t t, b, S = block_tables.shape[0], mb = block_tables.shape[1]
    for t in range(row_seq.shape[0]):
        if row_seq[t] < 0 or row_seq[t] >= S:
            raise ValueError(f"row {t}: sequence {row_seq[t]} outside the {S} block tables")
        if row_pos[t] < 0 or row_pos[t] // bs >= mb:
            raise ValueError(f"row {t}: position {row_pos[t]} beyond its block table of {mb} blocks")
        for b in range(row_pos[t] // bs + 1):
            if block_tables[row_seq[t], b] < 0 or block_tables[row_seq[t], b] >= nb:
                raise ValueError(f"row {t}: block id {block_tables[row_seq[t], b]} outside the pool of {nb}")


def paged_attention(const float[:, :, ::1] q, Kc, Vc,
                    const int32_t[:, ::1] block_tables, const int32_t[::1] row_seq, const int64_t[::1] row_pos,
                    float scale, float[:, :, ::1] out):
    """Causal GQA attention of q [T, H, hd] over the paged pools Kc [Hkv, n_blocks, hd, bs] and
    Vc [Hkv, n_blocks, bs, hd] (float32 or float16): row t attends to positions 0..row_pos[t]
    of sequence row_seq[t], whose blocks are listed in block_tables[row_seq[t]]."""
    cdef int64_t T = q.shape[0], H = q.shape[1], hd = q.shape[2]
    cdef int64_t shape[4]
    cdef void *kp
    cdef void *vp
    cdef int kv_type = _pools(Kc, Vc, &kp, &vp, shape)
    cdef int64_t nb = shape[0], Hkv = shape[1], bs = shape[2]
    cdef int64_t mb = block_tables.shape[1]
    cdef int rc
    if shape[3] != hd:
        raise ValueError("attention pool shape mismatch")
    if Hkv == 0 or H % Hkv != 0 or H // Hkv > 64:
        raise ValueError(f"{H} query heads cannot share {Hkv} kv heads evenly (at most 64 per kv head)")
    if bs < 1 or bs > 256:
        raise ValueError(f"block size {bs} outside 1..256")
    if row_seq.shape[0] != T or row_pos.shape[0] != T:
        raise ValueError("attention row arrays differ in length from q")
    if out.shape[0] != T or out.shape[1] != H or out.shape[2] != hd:
        raise ValueError("attention output shape mismatch")
    _check_rows(row_seq, row_pos, block_tables, bs, nb)
    if T == 0:
        return
    with nogil:
        rc = qw_paged_attention(&q[0, 0, 0], T, H, Hkv, hd, kv_type, kp, vp, nb, bs,
                                &block_tables[0, 0], mb, &row_seq[0], &row_pos[0], scale, &out[0, 0, 0])
    if rc != 0:
        raise MemoryError("attention: out of memory for its scratch buffers")


# ---------------------------------------------------------------- layers of experts

cdef void _moe_shape(qw_moe *m, int64_t hidden, int64_t n_experts, int64_t top_k, int64_t inter,
                     int64_t shared_inter) noexcept:
    m.hidden, m.n_experts, m.top_k, m.inter, m.shared_inter = hidden, n_experts, top_k, inter, shared_inter


def moe_scratch_bytes(int64_t hidden, int64_t n_experts, int64_t top_k, int64_t inter, int64_t shared_inter,
                      int64_t T):
    """Bytes of scratch a layer of experts of these shapes needs for a step of T rows
    (shared_inter: 0 without a shared expert)."""
    cdef qw_moe m
    _moe_shape(&m, hidden, n_experts, top_k, inter, shared_inter)
    return qw_moe_scratch_bytes(&m, T)


cdef class Experts:
    """A layer of experts, for moe_mlp and LayerStack: the router [n_experts, hidden], each
    expert's (gate, up, down) and, for Qwen2-MoE, the shared expert's and its gate [1, hidden],
    each a product as matmul_group takes it (its Y unused), checked here once. Holds the arrays
    it points into."""
    cdef qw_moe m
    cdef qw_product *prods
    cdef object keep

    def __cinit__(self):
        self.prods = NULL

    def __init__(self, int64_t hidden, int64_t top_k, bint norm_topk, router, experts, shared=None,
                 shared_gate=None):
        cdef int64_t E = len(experts), e, inter, sinter = 0
        if E < 1 or top_k < 1 or top_k > E:
            raise ValueError(f"{top_k} experts a row out of {E}")
        inter = experts[0][0][2]
        if shared is not None:
            sinter = shared[0][2]
        _moe_shape(&self.m, hidden, E, top_k, inter, sinter)
        self.m.norm_topk = norm_topk
        self.prods = <qw_product *>calloc(3 * E + 3, sizeof(qw_product))
        if self.prods == NULL:
            raise MemoryError()
        _weight(&self.m.router, router, E, hidden, "the router")
        for e in range(E):
            gate, up, down = experts[e]
            _weight(&self.prods[3 * e], gate, inter, hidden, f"expert {e}'s gate")
            _weight(&self.prods[3 * e + 1], up, inter, hidden, f"expert {e}'s up")
            _weight(&self.prods[3 * e + 2], down, hidden, inter, f"expert {e}'s down")
        self.m.experts = self.prods
        self.m.shared = NULL
        if shared is not None:
            _weight(&self.prods[3 * E], shared[0], sinter, hidden, "the shared expert's gate")
            _weight(&self.prods[3 * E + 1], shared[1], sinter, hidden, "the shared expert's up")
            _weight(&self.prods[3 * E + 2], shared[2], hidden, sinter, "the shared expert's down")
            _weight(&self.m.shared_gate, shared_gate, 1, hidden, "the shared expert's gate vector")
            self.m.shared = self.prods + 3 * E
        self.keep = (router, experts, shared, shared_gate)

    def __dealloc__(self):
        free(self.prods)


cdef void *_scratch(uint8_t[::1] scratch, size_t need) except NULL:
    if <size_t>scratch.shape[0] < need or need == 0:
        raise ValueError(f"expert scratch of {scratch.shape[0]} bytes, needs {need}")
    if (<size_t>&scratch[0]) % 64:
        raise ValueError("expert scratch not 64-byte aligned")
    return &scratch[0]


def moe_mlp(Experts ex, const float[:, ::1] h, float[:, ::1] out, uint8_t[::1] scratch, int act=0):
    """out = the layer of experts ex applied to the rows of h (csrc/moe.h); scratch: at least
    moe_scratch_bytes(..., rows) bytes of ex's shapes, 64-byte aligned."""
    cdef int64_t T = h.shape[0]
    cdef int rc
    cdef void *s
    _check_act(act)
    if h.shape[1] != ex.m.hidden or out.shape[0] != T or out.shape[1] != ex.m.hidden:
        raise ValueError(f"moe_mlp: rows of {ex.m.hidden} in and out, got {h.shape[1]} and {out.shape[1]}")
    if T == 0:
        return
    if &out[0, 0] == &h[0, 0]:
        raise ValueError("moe_mlp: out must not alias h")
    s = _scratch(scratch, qw_moe_scratch_bytes(&ex.m, T))
    with nogil:
        rc = qw_moe_mlp(&ex.m, &h[0, 0], T, act, s, &out[0, 0])
    if rc != 0:
        raise MemoryError("moe_mlp: out of memory for a product's scratch")


def moe_route(float[:, ::1] logits, int64_t top_k, bint norm_topk):
    """The router's picks (for tests): softmax of logits [T, n_experts] in place, then each row's
    top_k experts (int32, descending weight, ties to the lower expert) and their weights."""
    cdef int64_t T = logits.shape[0], E = logits.shape[1]
    if top_k < 1 or top_k > E:
        raise ValueError(f"{top_k} experts a row out of {E}")
    top = np.empty((T, top_k), np.int32)
    weight = np.empty((T, top_k), np.float32)
    cdef int32_t[:, ::1] tv = top
    cdef float[:, ::1] wv = weight
    if T:
        qw_moe_route(&logits[0, 0], T, E, top_k, norm_topk, &tv[0, 0], &wv[0, 0])
    return top, weight


# ---------------------------------------------------------------- the decoder layers

cdef float *_rows(object a, int64_t rows, int64_t width, str name) except? NULL:
    cdef float[:, ::1] m = a
    if m.shape[0] < rows or m.shape[1] != width:
        raise ValueError(f"buffer {name} is {m.shape[0]}x{m.shape[1]}, needs {rows}x{width}")
    return &m[0, 0] if width else NULL


cdef const float *_vec(object a, int64_t n, str name) except? NULL:
    cdef const float[::1] v
    if a is None:
        return NULL
    v = a
    if v.shape[0] != n:
        raise ValueError(f"{name} has {v.shape[0]} values, needs {n}")
    return &v[0]


cdef _product(qw_product *p, object prod, int64_t K, int64_t M, float *Y):
    """p from a product (as matmul_group takes it) that must write into the step's buffer Y."""
    _fill_product(p, prod, K, M)
    if p.Y != Y:
        raise ValueError("a product does not write into the step's buffer for it")


cdef class LayerStack:
    """The decoder layers of a model bound to one set of step buffers and one KV cache, for
    forward_layers: every pointer checked once here, so a step checks only its own rows. Holds
    the arrays it points into."""
    cdef qw_stack s
    cdef qw_layer *layers
    cdef int n
    cdef readonly int64_t capacity
    cdef object keep

    def __cinit__(self):
        self.layers = NULL

    def __init__(self, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t inter,
                 float eps, float scale, inv_freq, int act, buffers, layers, float rope_mscale=1.0):
        """buffers: (x, h, q, k, v, attn, o, gate, up, rope), each [capacity, width], and the
        experts' scratch (uint8, for capacity rows of every layer of experts; None without
        them); layers: per layer (attn_norm, mlp_norm, q_norm or None, k_norm or None, (q, k, v
        products), o product, (gate, up products), down product, K pool, V pool, Experts or
        None), a product being (W, dtype, N, Y, bias) with Y the buffer it writes (q, k, v; o;
        gate, up; o). A layer with Experts has None for its gate, up and down."""
        cdef int64_t C, i
        cdef int64_t shape[4]
        cdef void *kp
        cdef void *vp
        cdef int kv_type = -1, t
        _check_act(act)
        x, h, q, k, v, attn, o, gate, up, rope, moe_scratch = buffers
        C = np.asarray(x).shape[0]
        qs, kvs = heads * head_dim, kv_heads * head_dim
        self.s.hidden, self.s.heads, self.s.kv_heads, self.s.head_dim, self.s.inter = hidden, heads, kv_heads, head_dim, inter
        self.s.eps, self.s.scale, self.s.act = eps, scale, act
        self.s.inv_freq = _vec(inv_freq, head_dim // 2, "inv_freq")
        self.s.rope_mscale = rope_mscale
        self.s.x, self.s.h = _rows(x, C, hidden, "x"), _rows(h, C, hidden, "h")
        self.s.q, self.s.k, self.s.v = _rows(q, C, qs, "q"), _rows(k, C, kvs, "k"), _rows(v, C, kvs, "v")
        self.s.attn, self.s.o = _rows(attn, C, qs, "attn"), _rows(o, C, hidden, "o")
        self.s.gate, self.s.up = _rows(gate, C, inter, "gate"), _rows(up, C, inter, "up")
        self.s.rope = _rows(rope, C, head_dim, "rope")
        if kv_heads < 1 or heads % kv_heads or heads // kv_heads > 64 or head_dim < 2 or head_dim % 2:
            raise ValueError(f"{heads} query heads, {kv_heads} kv heads of {head_dim} have no attention kernel")
        self.n = len(layers)
        self.layers = <qw_layer *>calloc(max(self.n, 1), sizeof(qw_layer))
        if self.layers == NULL:
            raise MemoryError()
        self.s.n_blocks = -1
        self.s.moe_scratch = NULL
        for i, lay in enumerate(layers):
            an, mn, qn, kn, qkv, op, gu, dp, Kc, Vc, moe = lay
            L = &self.layers[i]
            L.attn_norm, L.mlp_norm = _vec(an, hidden, "attn_norm"), _vec(mn, hidden, "mlp_norm")
            L.q_norm, L.k_norm = _vec(qn, head_dim, "q_norm"), _vec(kn, head_dim, "k_norm")
            if (L.q_norm == NULL) != (L.k_norm == NULL):
                raise ValueError("q_norm and k_norm go together")
            _product(&L.qkv[0], qkv[0], hidden, C, self.s.q)
            _product(&L.qkv[1], qkv[1], hidden, C, self.s.k)
            _product(&L.qkv[2], qkv[2], hidden, C, self.s.v)
            _product(&L.o, op, qs, C, self.s.o)
            if moe is None:
                if not inter:
                    raise ValueError("a dense layer in a stack without MLP buffers")
                _product(&L.gate_up[0], gu[0], hidden, C, self.s.gate)
                _product(&L.gate_up[1], gu[1], hidden, C, self.s.up)
                _product(&L.down, dp, inter, C, self.s.o)
                L.moe = NULL
            else:
                if moe_scratch is None:
                    raise ValueError("a layer of experts without their scratch")
                if (<Experts?>moe).m.hidden != hidden:
                    raise ValueError("a layer of experts of another width")
                self.s.moe_scratch = _scratch(moe_scratch, qw_moe_scratch_bytes(&(<Experts>moe).m, C))
                L.moe = &(<Experts>moe).m
            t = _pools(Kc, Vc, &kp, &vp, shape)
            if shape[1] != kv_heads or shape[3] != head_dim or shape[2] < 1 or shape[2] > 256:
                raise ValueError("KV pool shape mismatch")
            if kv_type >= 0 and (t != kv_type or shape[0] != self.s.n_blocks or shape[2] != self.s.bs):
                raise ValueError("the layers' KV pools differ in type or shape")
            kv_type, self.s.n_blocks, self.s.bs = t, shape[0], shape[2]
            L.Kc, L.Vc = kp, vp
        self.s.kv_type = kv_type
        self.capacity = C
        self.keep = (buffers, layers, inv_freq)

    def __dealloc__(self):
        free(self.layers)


def forward_layers(LayerStack st, int64_t T, const int64_t[::1] pos, const int64_t[::1] slots,
                   const int32_t[:, ::1] block_tables, const int32_t[::1] row_seq):
    """Runs every layer of st over the first T rows of its x buffer (in place): row t at
    position pos[t] of sequence row_seq[t] (a row of block_tables), its key and value stored at
    slots[t], as forward.py's per-layer path computes it, bit for bit."""
    cdef int64_t mb = block_tables.shape[1], bs = st.s.bs, nb = st.s.n_blocks
    cdef int rc
    if T < 1 or T > st.capacity:
        raise ValueError(f"{T} rows for buffers of {st.capacity}")
    if pos.shape[0] != T or slots.shape[0] != T or row_seq.shape[0] != T:
        raise ValueError("row arrays differ in length from T")
    _check_slots(slots, nb, bs)
    _check_rows(row_seq, pos, block_tables, bs, nb)
    with nogil:
        rc = qw_forward_layers(&st.s, st.layers, st.n, T, &pos[0], &slots[0], &block_tables[0, 0], mb, &row_seq[0])
    if rc != 0:
        raise MemoryError("forward_layers: out of memory for a kernel's scratch buffers")


# ---------------------------------------------------------------- sampling

def argmax(const float[::1] x):
    if x.shape[0] == 0:
        raise ValueError("argmax of an empty array")
    return qw_argmax(&x[0], x.shape[0])


def sample(float[::1] logits, float temperature, int64_t top_k, float top_p, float min_p, double u,
           int32_t[::1] idx, float[::1] val):
    """Draw a token id from logits (modified in place); idx/val are scratch of the same length."""
    cdef int64_t n = logits.shape[0], r
    if n == 0 or idx.shape[0] < n or val.shape[0] < n:
        raise ValueError("sample: empty logits or scratch too small")
    with nogil:
        r = qw_sample(&logits[0], n, temperature, top_k, top_p, min_p, u, &idx[0], &val[0])
    if r == QW_SAMPLE_NOMEM:
        raise MemoryError("sample: out of memory for sorting the top-p candidates")
    return r


def _sample_fail_allocs(int n):
    """For tests: make the next n scratch allocations of sample() fail."""
    qw_sample_fail_allocs(n)


# the kernel path setting (each extension module carries its own copy of the kernels and of it)
include "_simd.pxi"
