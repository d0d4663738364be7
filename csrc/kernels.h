/* The SIMD kernels one kernel file provides to another (internal to csrc/). Each has a plain
 * twin in the file that dispatches to it; cpu.c decides which runs. */
#ifndef QWENC_KERNELS_H
#define QWENC_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "cpu.h"
#include "fdot.h"

/* quant_avx2.c: dequantizers (quant.c's plain ones, bit for bit). */
void qw_dequant_f16_avx2(const void *src, float *dst, int64_t n);
void qw_dequant_bf16_avx2(const void *src, float *dst, int64_t n);
void qw_dequant_q4_0_avx2(const void *src, float *dst, int64_t n);
void qw_dequant_q4_1_avx2(const void *src, float *dst, int64_t n);
void qw_dequant_q5_0_avx2(const void *src, float *dst, int64_t n);
void qw_dequant_q5_1_avx2(const void *src, float *dst, int64_t n);
void qw_dequant_q8_0_avx2(const void *src, float *dst, int64_t n);
void qw_dequant_q4_k_avx2(const void *src, float *dst, int64_t n);
void qw_dequant_q5_k_avx2(const void *src, float *dst, int64_t n);
void qw_dequant_q6_k_avx2(const void *src, float *dst, int64_t n);

/* quant_avx2.c: the chains (fdot.h) of `rows` weight rows of a stored type, `stride` bytes apart,
 * continued over the first K & ~7 values of x, the weights widened in registers: acc[r] for row r. */
void qw_fdot_rows_avx2(int dtype, const uint8_t *w, size_t stride, int rows, const float *x, int64_t K,
                       qw_fdot_acc *acc);
/* The same chains for the first `rows` rows of a repacked BF16 group (intdot.c; K a multiple of
 * 8), each half's 4 rows read from its one stream: the same bits as on the stored rows. */
void qw_fdot_group_bf16_avx2(const uint8_t *group, int rows, const float *x, int64_t K, qw_fdot_acc *acc);
/* The first `rows` (<= 4) rows of a repacked BF16 group's half widened into dst (K floats a row). */
void qw_dequant_bf16_half_avx2(const uint16_t *half, int rows, int64_t K, float *dst);

/* The integer product of one repacked 8-row group with M act rows (quant.h's order):
 * out[m * 8 + r] for row r of the group and act row m (at xq + m * xstride), M <= QW_R8_MAX_M. */
#define QW_R8_MAX_M 16
typedef void (*qw_r8_fn)(const uint8_t *group, int64_t K, const uint8_t *xq, size_t xstride, int64_t M, float *out);

/* The pair kernels (qw_r8_kernel_pairs) take the same product with the act rows as pair rows:
 * act rows 2p and 2p + 1 interleaved 4 bytes at a time (their first 4 bytes, the second's first
 * 4, their next 4, ...; a row's fields are all 4-byte units, per 32-value block), pair p at
 * xq + p * xstride. When M is odd the last pair's second row is anything (its outputs are not
 * written). One field differs from the plain rows: each block's code sums (4 bytes per row and
 * level) hold what the code offsets take off, negated, so that a kernel starts a sum there
 * instead of subtracting at its end:
 *   8-bit rows:  the block's two 16-value code sums negated (two int16, as stored);
 *   16-bit rows: in level 1's field, the int32 -(256 s1_lo + s2_lo), the low 16-value group's
 *                sum of the joined codes 256 q1 + q2; in level 2's, -(256 s1 + s2), the whole
 *                block's (s1, s2: the levels' block code sums; lo: of the first 16 values).
 * qw_quantize_pairs_avx512 builds them from float rows; qw_pair_act_rows, the plain reference,
 * from act rows. */

/* The AMX kernels take 16 act rows as one AMX block: per 32-value block, each level's codes as
 * 16 rows of 32 (tile A as it is loaded, 512 bytes a level), then the last level's d and s of the
 * 16 rows (16 floats each); QW_AMX_ACT_BLOCK bytes per 32 values. The code sums are not needed
 * (the kernels take the code offsets off in the weights). */
#define QW_AMX_ACT_BLOCK(bits) ((size_t)((bits) == 16 ? 2 : 1) * 512 + 128)
/* The bf16 AMX blocks of 16-bit rows (intdot_amx.c; for the bf16 kernels): per 32-value block,
 * level 1's codes as the bf16 values 256 q1 and level 2's as q2, each 16 rows of 32 (1 KiB a
 * level), then level 2's d and s of the 16 rows; QW_AMX_ACT_BLOCK_BF16 bytes per 32 values. */
#define QW_AMX_ACT_BLOCK_BF16 ((size_t)2048 + 128)
/* Either form from 16 float rows `ldx` values apart, quantized straight into the block: the codes
 * and scales act.c's quantizers give those rows (intdot_amx.c; for AMX CPUs, all of which have
 * AVX-512). */
void qw_amx_quantize_x86(const float *X, size_t ldx, int64_t n, int bits, int bf16, uint8_t *dst);

/* The AMX product (intdot_amx.c) of n AMX blocks (block j at xa + j * astride, 16 act rows each)
 * with the 16 rows of two repacked groups g0 and g1 (g1 NULL when there is only one: outputs
 * 8-15 are then not meaningful), over K's 32-value blocks b0 .. b1 - 1: out[(16 j + m) * 16 + r]
 * for act row m of block j, r < 8 from g0, r >= 8 from g1 (out 64-byte aligned); the same bits as
 * the other kernels' outputs for those rows. The groups are unpacked into `work` (QW_AMX_WORK(n)
 * bytes, 64-byte aligned) a few blocks at a time, once for all n blocks. A product may be cut
 * into runs of blocks, one call each, with the same bits as one call over all of K (each
 * output's sums are continued in block order): QW_AMX_FIRST starts out and macc (the min sums of
 * the types that have mins, n * 256 floats, 64-byte aligned) at zero, else the call continues
 * them; QW_AMX_LAST takes the mins off out at the end. */
#define QW_AMX_CHUNK 8        /* blocks unpacked at a time */
#define QW_AMX_WORK_BLOCK 1216 /* bytes of one unpacked block: tile B (up to 1 KiB), then 3 x 16 floats */
#define QW_AMX_WORK(n) ((size_t)QW_AMX_CHUNK * QW_AMX_WORK_BLOCK + (size_t)(n) * 1024) /* and n min sums */
#define QW_AMX_MACC(work) ((float *)((work) + (size_t)QW_AMX_CHUNK * QW_AMX_WORK_BLOCK)) /* their place */
#define QW_AMX_FIRST 1
#define QW_AMX_LAST 2
/* The calling thread's tiles released (back to their init state, which the OS need not save):
 * after the AMX products of a matmul, each thread that ran them; the kernels leave them loaded. */
void qw_amx_release_x86(void);
typedef void (*qw_amx_fn)(const uint8_t *g0, const uint8_t *g1, const uint8_t *xa, size_t astride, int64_t n,
                          uint8_t *work, float *out, float *macc, int64_t b0, int64_t b1, int flags);
qw_amx_fn qw_amx_kernel_x86(int dtype, int bits);
/* The AMX kernel for a stored type when the AMX path is taken (cpu.h), else NULL. */
qw_amx_fn qw_amx_kernel(int dtype, int bits);
/* The same product of 16-bit rows on bf16 tiles, taking bf16 AMX blocks: for the types whose
 * block sums stay exact in float32 there (Q4_0, Q4_1, Q5_0, Q4_K, Q6_K; NULL for the others), when
 * the path with bf16 tiles is taken (cpu.h); the same bits again. */
qw_amx_fn qw_amx_kernel_bf16_x86(int dtype);
qw_amx_fn qw_amx_kernel_bf16(int dtype);

/* A joined row: a 16-bit act row as the vertical kernels (qw_r8_kernel_vertical) read it, per 4
 * values v0..v3, the int16s j0, j2, j1, j3 (j = 256 q1 + q2, the two levels' codes joined, at
 * most 32639 in magnitude), n of them; then level 2's d of each block (n / 32 floats), then level
 * 2's s. JOINED_BYTES(n) (qblock.h) bytes; qw_join_act_rows builds one from a
 * 16-bit act row. The order puts each of a kernel's 16-bit code pairs (codes 4s and 4s + 2, or
 * 4s + 1 and 4s + 3, the halves of a row's 4 bytes in a step vector) against one int32 of the
 * row. No code sums: the kernels take the code offsets off the widened codes. */
void qw_join_act_rows(const uint8_t *x, uint8_t *dst, int64_t n);
/* The vertical kernels take joined rows 8 at a time transposed (qblock.h's VERT_*;
 * qw_vertical_act_rows builds a block from `rows` <= 8 joined rows `stride` bytes apart): a
 * vector holds one weight row's sums with 8 act rows, each widened weight pair broadcast. They
 * take xstride as the bytes of one 8-row block and give the two-level kernels' bits. */
void qw_vertical_act_rows(const uint8_t *joined, size_t stride, int rows, uint8_t *dst, int64_t n);

/* qw_dot_row_act's product of one stored row with a joined row xj by the vertical kernel of the
 * current path (for tests): its output, or NAN when the path has none or out of memory. */
float qw_dot_row_joined(int dtype, const void *row, const void *xj, int64_t n);

/* Pair row `dst` (qw_act_bytes(QW_Q8_0, n, bits) bytes per row, so twice that) from the act
 * rows a and b of n values (act.c; plain C, the reference the tests hold the pair rows to). */
void qw_pair_act_rows(const uint8_t *a, const uint8_t *b, uint8_t *dst, int64_t n, int bits);
/* Up to 16 float rows of n values (row m at X + m * ldx, 1 <= rows <= 16) straight into pair rows
 * (pair p at dst + p * pstride, (rows + 1) / 2 of them, an odd last row paired with itself), for
 * the 32-value blocks b0 .. b1 - 1: the bytes qw_quantize_act (Q8_0, bits) and qw_pair_act_rows
 * give those blocks (act_avx512.c; only for a CPU with AVX-512, qw_use_avx512()). */
void qw_quantize_pairs_avx512(const float *X, size_t ldx, int rows, int64_t n, int bits, uint8_t *dst, size_t pstride,
                              int64_t b0, int64_t b1);

/* Decode streams every weight matrix from memory once per token, in runs of a few KiB (one 8-row
 * group's records, then the next group's), and the hardware prefetcher alone kept the integer
 * products near half of the machine's read bandwidth. So each 32-value sub-block of a record
 * asks for its share of the record lying QW_PREFETCH_AHEAD bytes further on (the groups of a
 * work item are contiguous, so this runs on into the next group). 2 KiB measured best on a
 * 2-core Zen 3 (1 KiB and 8 KiB were slower; 4 KiB about the same).
 *
 * The same share is also asked for QW_PREFETCH_FAR bytes on, into L2 only (prefetcht1): requests
 * into L1 wait on its few miss buffers (the one-row products read 27-31 GB/s on two cores where
 * the memory gave 54-60); the far requests keep more lines on their way, and the near ones then
 * find them in L2. On a 2-core Zen 4 with a quiet memory, the 1.5B's int16 decode went from
 * 33.2 to 41.7 tok/s (medians of 7, alternating; the demo 72.5 -> 77); 8 KiB gained less, 32 KiB
 * no more. */
#define QW_PREFETCH_AHEAD 2048
#define QW_PREFETCH_FAR 16384
static inline void qw_prefetch_share(const uint8_t *rec, int rec_bytes, int subs, int j) {
    const int lines = (rec_bytes + 64 * subs - 1) / (64 * subs);
    const uint8_t *share = rec + 64 * lines * j;
    for (int l = 0; l < lines; l++) {
        __builtin_prefetch(share + QW_PREFETCH_AHEAD + 64 * l, 0, 3);
        __builtin_prefetch(share + QW_PREFETCH_FAR + 64 * l, 0, 2);
    }
}

/* intdot_avx2.c, intdot_avx512.c: the AVX2 and AVX-512 VNNI products per stored type and act
 * bits, and the AVX-512 ones that take act rows in pairs in 512-bit vectors (NULL for other
 * types; all give the AVX2 ones' bits). */
qw_r8_fn qw_r8_kernel_avx2(int dtype, int bits);
qw_r8_fn qw_r8_kernel_avx512(int dtype, int bits);
qw_r8_fn qw_r8_kernel_avx512w(int dtype, int bits);
/* Two consecutive repacked groups (16 weight rows) with M = 8 or 16 act rows as pair rows:
 * out[(h * M + m) * 8 + r] for row r of group h and act row m, the bits the pair kernel gives each
 * group alone (intdot_avx512.c: Q4_0 and Q5_0, 16-bit rows; NULL for the others). */
typedef void (*qw_r8_two_fn)(const uint8_t *groups, int64_t K, const uint8_t *xq, size_t xstride, int64_t M,
                             float *out);
qw_r8_two_fn qw_r8_kernel_avx512w2(int dtype, int bits);
/* intdot_avx2.c: the AVX2 16-bit products on vertical blocks of joined rows. */
qw_r8_fn qw_r8_kernel_vertical_avx2(int dtype);

/* intdot.c: the kernel for `dtype` (a stored type with an integer dot) on the current SIMD
 * setting, and the group layout's size. */
qw_r8_fn qw_r8_kernel(int dtype, int bits);
/* The pair kernel for `dtype` on the current SIMD setting, or NULL where that has none (then
 * qw_r8_kernel's is the one). */
qw_r8_fn qw_r8_kernel_pairs(int dtype, int bits);
/* Its two-group form on the current SIMD setting, or NULL where that has none. */
qw_r8_two_fn qw_r8_kernel_pairs2(int dtype, int bits);
/* The 16-bit kernel for `dtype` that takes vertical blocks of joined rows, on the current SIMD
 * setting, or NULL where that has none (the AVX2 path has them: there the two levels' byte
 * products cost more than the joined rows' 16-bit ones; an 8-bit row's one level costs less, so
 * 8-bit rows stay plain). */
qw_r8_fn qw_r8_kernel_vertical(int dtype);
/* Bytes of one repacked 8-row group of K values (`dtype` the stored type). */
size_t qw_r8_group_bytes(int dtype, int64_t K);
/* Repack rows [0, n) (n <= 8) of stored type `dtype` at src (row stride `stride`) into one
 * group (the missing rows zeros). */
void qw_repack_group(int dtype, const uint8_t *src, size_t stride, int n, int64_t K, uint8_t *group);

#endif
