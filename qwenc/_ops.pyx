# cython: language_level=3
"""Python face of the model kernels in csrc/ (matmul, norms, RoPE, attention, sampling).

Arguments are typed memoryviews, so shapes and dtypes are checked by Cython at the call; the C
kernels run without the GIL. These wrappers check shapes only where a mismatch would make C read
or write out of bounds.
"""
from libc.stdint cimport int32_t, int64_t, uint8_t

import numpy as np


cdef extern from "cpu.h":
    int qw_use_avx2() nogil
    int qw_cpu_has_avx2() nogil
    int qw_set_simd(int enabled) nogil
    int qw_get_threads() nogil
    void qw_set_threads(int n) nogil

cdef extern from "quant.h":
    int qw_dtype_supported(int dtype) nogil
    size_t qw_row_bytes(int dtype, int64_t n) nogil
    int qw_block_size(int dtype) nogil

cdef extern from "matmul.h":
    void qw_matmul(const void *W, int dtype, int64_t N, int64_t K, const float *X, int64_t M, float *Y,
                   const float *bias, int act) nogil
    ctypedef struct qw_product:
        const void *W
        int dtype
        int64_t N
        float *Y
        const float *bias
    int QW_GROUP_MAX
    void qw_matmul_group(const qw_product *p, int count, int64_t K, const float *X, int64_t M, int act) nogil

cdef extern from "ops.h":
    void qw_rmsnorm(const float *x, const float *w, float eps, int64_t M, int64_t D, float *out) nogil
    void qw_rope(float *x, int64_t T, int64_t H, int64_t hd, const int64_t *pos, const float *inv_freq) nogil
    void qw_silu_mul(const float *gate, const float *up, int64_t n, float *out) nogil
    void qw_softmax(float *x, int64_t M, int64_t n) nogil
    void qw_embed(const void *E, int dtype, int64_t D, const int32_t *ids, int64_t T, float *out) nogil

cdef extern from "attention.h":
    void qw_attention(const float *q, const float *K, const float *V, int64_t T, int64_t start, int64_t n_heads,
                      int64_t n_kv_heads, int64_t hd, int64_t cap, float scale, float *out) nogil

cdef extern from "sample.h":
    int64_t qw_argmax(const float *x, int64_t n) nogil
    int64_t qw_sample(float *logits, int64_t n, float temperature, int64_t top_k, float top_p, float min_p,
                      double u, int32_t *idx, float *val) nogil


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


# ---------------------------------------------------------------- linear algebra

ACTIVATIONS = {"f32": 0, "int16": 16, "int8": 8}  # matmul.h's QW_ACT_* codes


cdef _check_product(const uint8_t[::1] W, int dtype, int64_t N, int64_t K, int64_t M, float[:, ::1] Y,
                    const float[::1] bias):
    if not qw_dtype_supported(dtype):
        raise ValueError(f"unsupported weight type {dtype}")
    if K % qw_block_size(dtype) != 0:
        raise ValueError(f"row length {K} is not a multiple of the block size {qw_block_size(dtype)}")
    if <size_t>W.shape[0] < qw_row_bytes(dtype, K) * N:
        raise ValueError("weight buffer too small for its shape")
    if Y.shape[0] != M or Y.shape[1] != N:
        raise ValueError(f"shape mismatch: X {M}x{K}, W {N}x{K}, Y {Y.shape[0]}x{Y.shape[1]}")
    if bias is not None and bias.shape[0] != N:
        raise ValueError("bias length differs from the output size")


def _check_act(int act):
    if act not in (0, 8, 16):
        raise ValueError(f"unknown activation code {act}")


def matmul(const uint8_t[::1] W, int dtype, int64_t N, int64_t K, const float[:, ::1] X,
           float[:, ::1] Y, const float[::1] bias=None, int act=0):
    """Y[M, N] = X[M, K] @ W.T (+ bias), W being N stored rows of K elements of type dtype.

    act: a code of ACTIVATIONS: float activations, or 16-bit or 8-bit act rows and integer dots
    in decode-sized products over block-quantized weights (see matmul.h)."""
    cdef int64_t M = X.shape[0]
    _check_act(act)
    if X.shape[1] != K:
        raise ValueError(f"shape mismatch: X {X.shape[0]}x{X.shape[1]}, W {N}x{K}")
    _check_product(W, dtype, N, K, M, Y, bias)
    cdef const float *b = &bias[0] if bias is not None else NULL
    if M == 0:
        return
    with nogil:
        qw_matmul(&W[0], dtype, N, K, &X[0, 0], M, &Y[0, 0], b, act)


def matmul_group(products, const float[:, ::1] X, int act=0):
    """For each (W, dtype, N, Y, bias) in products: Y[M, N] = X @ W.T (+ bias), every W with
    X's row length. Decode-sized products run as one parallel pass over all the matrices' rows
    (a layer's q, k, v; gate, up), each row exactly as matmul computes it."""
    cdef int64_t M = X.shape[0], K = X.shape[1]
    cdef qw_product p[4]  # QW_GROUP_MAX
    cdef const uint8_t[::1] w
    cdef float[:, ::1] y
    cdef const float[::1] b
    cdef int i, count = len(products)
    _check_act(act)
    if count < 1 or count > min(QW_GROUP_MAX, 4):
        raise ValueError(f"a group holds 1 to {QW_GROUP_MAX} products, got {count}")
    for i in range(count):
        W, dtype, N, Y, bias = products[i]
        w, y, b = W, Y, bias
        _check_product(w, dtype, N, K, M, y, b)
        p[i].W = &w[0]
        p[i].dtype = dtype
        p[i].N = N
        p[i].Y = &y[0, 0] if M > 0 else NULL
        p[i].bias = &b[0] if b is not None else NULL
    if M == 0:
        return
    with nogil:
        qw_matmul_group(p, count, K, &X[0, 0], M, act)


def embed(const uint8_t[::1] E, int dtype, int64_t V, int64_t D, const int32_t[::1] ids, float[:, ::1] out):
    """out[t] = row ids[t] of the stored embedding table E (V rows of D)."""
    cdef int64_t T = ids.shape[0], t
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
        qw_embed(&E[0], dtype, D, &ids[0], T, &out[0, 0])


# ---------------------------------------------------------------- element-wise

def rmsnorm(const float[:, ::1] x, const float[::1] w, float eps, float[:, ::1] out):
    cdef int64_t M = x.shape[0], D = x.shape[1]
    if w.shape[0] != D or out.shape[0] != M or out.shape[1] != D:
        raise ValueError("rmsnorm shape mismatch")
    if M == 0:
        return
    with nogil:
        qw_rmsnorm(&x[0, 0], &w[0], eps, M, D, &out[0, 0])


def rope(float[:, :, ::1] x, const int64_t[::1] pos, const float[::1] inv_freq):
    """Rotate x[T, H, hd] in place for positions pos[T] (pairs i and i + hd/2)."""
    cdef int64_t T = x.shape[0], H = x.shape[1], hd = x.shape[2]
    if pos.shape[0] != T or inv_freq.shape[0] != hd // 2 or hd % 2:
        raise ValueError("rope shape mismatch")
    if T == 0:
        return
    with nogil:
        qw_rope(&x[0, 0, 0], T, H, hd, &pos[0], &inv_freq[0])


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

def attention(const float[:, :, ::1] q, const float[:, :, ::1] K, const float[:, :, ::1] V, int64_t start,
              float scale, float[:, :, ::1] out):
    """Causal GQA attention of q[T, H, hd] (positions start..start+T-1) over K, V [Hkv, cap, hd]."""
    cdef int64_t T = q.shape[0], H = q.shape[1], hd = q.shape[2]
    cdef int64_t Hkv = K.shape[0], cap = K.shape[1]
    if K.shape[2] != hd or V.shape[0] != Hkv or V.shape[1] != cap or V.shape[2] != hd:
        raise ValueError("attention cache shape mismatch")
    if Hkv == 0 or H % Hkv != 0:
        raise ValueError(f"{H} query heads cannot share {Hkv} kv heads evenly")
    if start < 0 or start + T > cap:
        raise ValueError(f"positions {start}..{start + T - 1} exceed the cache of {cap}")
    if out.shape[0] != T or out.shape[1] != H or out.shape[2] != hd:
        raise ValueError("attention output shape mismatch")
    if T == 0:
        return
    with nogil:
        qw_attention(&q[0, 0, 0], &K[0, 0, 0], &V[0, 0, 0], T, start, H, Hkv, hd, cap, scale, &out[0, 0, 0])


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
    return r
