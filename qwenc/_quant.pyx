# cython: language_level=3
"""Weight storage types: dequantization and quantization of rows (csrc/quant.c).

The row kernels are what the model runs on; these wrappers expose them to Python for loading
(small tensors to float32), for tests against a reference implementation, and for benchmarks.
"""
import numpy as np

cimport numpy as cnp
from cython.parallel cimport prange
from libc.stdint cimport int64_t

cnp.import_array()


cdef extern from "quant.h":
    int qw_dtype_supported(int dtype)
    int qw_block_size(int dtype)
    size_t qw_row_bytes(int dtype, int64_t n)
    void qw_dequant_row(int dtype, const void *src, float *dst, int64_t n) nogil
    float qw_dot_row(int dtype, const void *row, const float *x, int64_t n) nogil
    void qw_quantize_row_q8_0(const float *src, void *dst, int64_t n) nogil
    size_t qw_act_bytes(int dtype, int64_t n, int bits)
    void qw_quantize_act(int dtype, const float *x, void *dst, int64_t n, int bits) nogil
    float qw_dot_row_act(int dtype, const void *row, const void *xq, int64_t n, int bits) nogil
    size_t qw_matrix_bytes(int dtype, int64_t N, int64_t K)
    void qw_dequant_matrix_row(int dtype, const void *W, int64_t K, int64_t n, float *dst) nogil

cdef extern from "kernels.h":
    void qw_pair_act_rows(const unsigned char *a, const unsigned char *b, unsigned char *dst, int64_t n,
                          int bits) nogil
    void qw_join_act_rows(const unsigned char *x, unsigned char *dst, int64_t n) nogil
    float qw_dot_row_joined(int dtype, const void *row, const void *xj, int64_t n) nogil
    void *qw_r8_kernel_vertical(int dtype)

cdef extern from "qblock.h":
    size_t JOINED_BYTES(int64_t n)

cdef extern from "matmul.h":
    int qw_matmul(const void *W, int dtype, int64_t N, int64_t K, const float *X, int64_t M, float *Y,
                  const float *bias, int act) nogil

cdef extern from "cpu.h":
    int qw_cpu_has_avx2()
    int qw_set_simd(int enabled)
    int qw_simd_level()
    int qw_cpu_simd_level()
    int qw_default_simd_level()
    int qw_set_simd_level(int level)
    int qw_use_avx2()
    int qw_get_threads() nogil
    void qw_set_threads(int n) nogil

Q8_0 = 8


def _row_bytes(int dtype, Py_ssize_t rows, Py_ssize_t cols):
    """Bytes per row, after checking the type and the shape."""
    if not qw_dtype_supported(dtype):
        raise ValueError(f"unsupported weight type code {dtype}")
    if rows < 0 or cols <= 0:
        raise ValueError(f"bad shape [{rows}, {cols}]")
    bs = qw_block_size(dtype)
    if cols % bs:
        raise ValueError(f"row length {cols} is not a multiple of the type's block size {bs}")
    return qw_row_bytes(dtype, cols)


REPACKED = 256  # quant.h's QW_R8: repacked type codes are REPACKED + the stored type's


def _as_bytes(data, int dtype, Py_ssize_t rows, Py_ssize_t cols, repacked_ok=False):
    """`data` as a C-contiguous uint8 array of exactly the bytes of a [rows, cols] matrix (no copy
    if it is one), and the bytes per row. Repacked types only where `repacked_ok` (their rows
    are not contiguous)."""
    if dtype >= REPACKED and not repacked_ok:
        raise ValueError(f"type {dtype} is a repacked layout: its rows are not stored one by one")
    rb = _row_bytes(dtype, rows, cols)
    arr = np.asarray(data)
    if arr.dtype != np.uint8:
        raise ValueError(f"expected uint8 data, got {arr.dtype}")
    arr = np.ascontiguousarray(arr).reshape(-1)
    need = qw_matrix_bytes(dtype, rows, cols)
    if arr.size != need:
        raise ValueError(f"type {dtype} [{rows}, {cols}] needs {need} bytes, got {arr.size}")
    return arr, rb


def dequantize(data, int dtype, Py_ssize_t rows, Py_ssize_t cols):
    """float32 [rows, cols] from the bytes of a [rows, cols] tensor of type `dtype` (a stored
    type, or a repacked one from qwenc._ops.repack)."""
    arr, rb = _as_bytes(data, dtype, rows, cols, repacked_ok=True)
    out = np.empty((rows, cols), dtype=np.float32)
    cdef const unsigned char[::1] src = arr
    cdef float[:, ::1] dst = out
    cdef Py_ssize_t r
    if rows == 0:
        return out
    with nogil:
        for r in range(rows):
            qw_dequant_matrix_row(dtype, &src[0], cols, r, &dst[r, 0])
    return out


def dot_rows(data, int dtype, Py_ssize_t rows, Py_ssize_t cols, x):
    """float32 [rows]: each stored row dotted with x (float32 [cols]), by the fused row kernel."""
    arr, rb = _as_bytes(data, dtype, rows, cols)
    xa = np.ascontiguousarray(x, dtype=np.float32)
    if xa.ndim != 1 or xa.shape[0] != cols:
        raise ValueError(f"x must have shape [{cols}], got {list(np.shape(x))}")
    out = np.empty(rows, dtype=np.float32)
    cdef const unsigned char[::1] src = arr
    cdef const float[::1] xv = xa
    cdef float[::1] dst = out
    cdef size_t row_bytes = rb
    cdef Py_ssize_t r
    if rows == 0:
        return out
    with nogil:
        for r in range(rows):
            dst[r] = qw_dot_row(dtype, &src[r * row_bytes], &xv[0], cols)
    return out


def _float_rows(x):
    """x as a C-contiguous float32 2-D array (rows of values to quantize)."""
    xa = np.ascontiguousarray(x, dtype=np.float32)
    if xa.ndim != 2:
        raise ValueError(f"expected a 2-D array, got shape {list(xa.shape)}")
    return xa


def quantize_q8_0(x):
    """uint8 [rows, cols / 32 * 34]: the Q8_0 bytes of a float32 [rows, cols] array."""
    xa = _float_rows(x)
    rows, cols = xa.shape
    rb = _row_bytes(Q8_0, rows, cols)
    out = np.empty((rows, rb), dtype=np.uint8)
    cdef const float[:, ::1] src = xa
    cdef unsigned char[:, ::1] dst = out
    cdef Py_ssize_t r, nrows = rows, ncols = cols
    if nrows == 0:
        return out
    with nogil:
        for r in range(nrows):
            qw_quantize_row_q8_0(&src[r, 0], &dst[r, 0], ncols)
    return out


def act_bytes(int dtype, Py_ssize_t n, int bits=8):
    """Bytes of a quantized activation row of n values for weights of `dtype` (0: no integer
    path): an 8-bit act row, or a 16-bit one (two 8-bit levels)."""
    if bits not in (8, 16):
        raise ValueError(f"bits must be 8 or 16, got {bits}")
    return qw_act_bytes(dtype, n, bits)


def _act_row_bytes(int dtype, Py_ssize_t n, int bits):
    """act_bytes, refusing a type without an integer dot."""
    ab = act_bytes(dtype, n, bits)
    if ab == 0:
        raise ValueError(f"type {dtype} has no integer dot")
    return ab


def quantize_activations(x, int dtype, int bits=8):
    """uint8 [rows, act_bytes(dtype, cols, bits)]: each row of the float32 [rows, cols] array x as
    an 8-bit or 16-bit activation row for the integer dot with weights of `dtype` (layout in
    csrc/quant.h)."""
    xa = _float_rows(x)
    rows, cols = xa.shape
    _row_bytes(dtype, rows, cols)
    out = np.empty((rows, _act_row_bytes(dtype, cols, bits)), dtype=np.uint8)
    cdef const float[:, ::1] src = xa
    cdef unsigned char[:, ::1] dst = out
    cdef Py_ssize_t r, nrows = rows, ncols = cols
    if nrows == 0:
        return out
    with nogil:
        for r in range(nrows):
            qw_quantize_act(dtype, &src[r, 0], &dst[r, 0], ncols, bits)
    return out


def pair_activations(xq, Py_ssize_t cols, int bits=8):
    """uint8 [(rows + 1) // 2, 2 * row bytes]: act rows (uint8 [rows, act_bytes(Q8_0, cols, bits)],
    from quantize_activations) as the pair rows the wide AVX-512 kernels take (csrc/kernels.h),
    an odd last row paired with itself."""
    ab = _act_row_bytes(Q8_0, cols, bits)
    xa = np.ascontiguousarray(xq)
    if xa.dtype != np.uint8 or xa.ndim != 2 or xa.shape[1] != ab:
        raise ValueError(f"xq must be uint8 rows of {ab} bytes, got {xa.shape} {xa.dtype}")
    rows = xa.shape[0]
    out = np.empty(((rows + 1) // 2, 2 * ab), dtype=np.uint8)
    cdef const unsigned char[:, ::1] src = xa
    cdef unsigned char[:, ::1] dst = out
    cdef Py_ssize_t p
    for p in range(out.shape[0]):
        qw_pair_act_rows(&src[2 * p, 0], &src[min(2 * p + 1, rows - 1), 0], &dst[p, 0], cols, bits)
    return out


def _int_dot_rows(arr, size_t row_bytes, int dtype, Py_ssize_t rows, Py_ssize_t cols, xa, int bits):
    """float32 [rows]: each row of arr (row_bytes apart) dotted with the checked act row xa, by
    qw_dot_row_act with `bits`, or (bits 0) as a joined row by qw_dot_row_joined."""
    out = np.empty(rows, dtype=np.float32)
    if rows == 0:
        return out
    cdef const unsigned char[::1] src = arr
    cdef const unsigned char[::1] xv = xa
    cdef float[::1] dst = out
    cdef Py_ssize_t r
    with nogil:
        for r in range(rows):
            dst[r] = (qw_dot_row_joined(dtype, &src[r * row_bytes], &xv[0], cols) if bits == 0 else
                      qw_dot_row_act(dtype, &src[r * row_bytes], &xv[0], cols, bits))
    return out


def join_activations(xq, Py_ssize_t cols):
    """uint8 [rows, joined bytes]: 16-bit act rows (uint8 [rows, act_bytes(Q8_0, cols, 16)], from
    quantize_activations) as the joined rows the AVX2 16-bit kernels take (csrc/kernels.h)."""
    ab = _act_row_bytes(Q8_0, cols, 16)
    xa = np.ascontiguousarray(xq)
    if xa.dtype != np.uint8 or xa.ndim != 2 or xa.shape[1] != ab:
        raise ValueError(f"xq must be uint8 rows of {ab} bytes, got {xa.shape} {xa.dtype}")
    out = np.empty((xa.shape[0], JOINED_BYTES(cols)), dtype=np.uint8)
    cdef const unsigned char[:, ::1] src = xa
    cdef unsigned char[:, ::1] dst = out
    cdef Py_ssize_t r
    for r in range(out.shape[0]):
        qw_join_act_rows(&src[r, 0], &dst[r, 0], cols)
    return out


def has_joined_kernels():
    """True when the current path multiplies 16-bit act rows as joined rows (AVX2)."""
    return qw_r8_kernel_vertical(Q8_0) != NULL


def dot_rows_joined(data, int dtype, Py_ssize_t rows, Py_ssize_t cols, xj):
    """float32 [rows]: dot_rows_act's products for a 16-bit act row, by the current path's kernel
    for joined rows (vertical: the row alone in its block of 8), taking the row as a joined row xj
    (uint8 [joined bytes], from join_activations)."""
    arr, rb = _as_bytes(data, dtype, rows, cols)
    _act_row_bytes(dtype, cols, 16)
    if qw_r8_kernel_vertical(dtype) == NULL:
        raise ValueError(f"the {simd_path()} path has no joined kernel for type {dtype}")
    xa = np.ascontiguousarray(xj).reshape(-1)
    if xa.dtype != np.uint8 or xa.shape[0] != JOINED_BYTES(cols):
        raise ValueError(f"xj must be {JOINED_BYTES(cols)} uint8 bytes, got {xa.shape[0]} {xa.dtype}")
    return _int_dot_rows(arr, rb, dtype, rows, cols, xa, 0)


def dot_rows_act(data, int dtype, Py_ssize_t rows, Py_ssize_t cols, xq, int bits=8):
    """float32 [rows]: each stored row dotted, by the integer kernel, with the activation row xq
    (uint8 [act_bytes(dtype, cols, bits)], from quantize_activations)."""
    arr, rb = _as_bytes(data, dtype, rows, cols)
    ab = _act_row_bytes(dtype, cols, bits)
    xa = np.ascontiguousarray(xq).reshape(-1)
    if xa.dtype != np.uint8 or xa.shape[0] != ab:
        raise ValueError(f"xq must be {ab} uint8 bytes, got {xa.shape[0]} {xa.dtype}")
    return _int_dot_rows(arr, rb, dtype, rows, cols, xa, bits)


def matvec(data, int dtype, Py_ssize_t rows, Py_ssize_t cols, x, int bits=8, int threads=1):
    """float32 [rows]: the matrix (stored or repacked) times x (float32 [cols]) as a decode step
    computes it, by qw_matmul with `threads` threads: float activations (bits=0), or (bits=8 or
    16, for the block-quantized types) x quantized once to an act row and the integer products.
    For benchmarks."""
    arr, rb = _as_bytes(data, dtype, rows, cols, repacked_ok=True)
    xa = np.ascontiguousarray(x, dtype=np.float32)
    if xa.ndim != 1 or xa.shape[0] != cols:
        raise ValueError(f"x must have shape [{cols}], got {list(np.shape(x))}")
    if threads < 1:
        raise ValueError("threads must be >= 1")
    if bits not in (0, 8, 16):
        raise ValueError(f"bits must be 0, 8 or 16, got {bits}")
    out = np.empty(rows, dtype=np.float32)
    cdef const unsigned char[::1] src = arr
    cdef const float[::1] xv = xa
    cdef float[::1] dst = out
    cdef int rc, prev
    if rows == 0:
        return out
    with nogil:
        prev = qw_get_threads()
        qw_set_threads(threads)
        rc = qw_matmul(&src[0], dtype, rows, cols, &xv[0], 1, &dst[0], NULL, bits)
        qw_set_threads(prev)
    if rc != 0:
        raise MemoryError("matvec: out of memory")
    return out


def set_simd(enabled):
    """Use the AVX2 kernels (True, where the CPU has them) or the plain C ones; returns the
    previous setting."""
    return bool(qw_set_simd(1 if enabled else 0))


def simd_enabled():
    """True when the kernels currently take their AVX2 path."""
    return bool(qw_use_avx2())


def has_avx2():
    """True when this CPU has AVX2, FMA and F16C (whatever the setting)."""
    return bool(qw_cpu_has_avx2())


# the kernel path setting (each extension module carries its own copy of the kernels and of it)
include "_simd.pxi"
