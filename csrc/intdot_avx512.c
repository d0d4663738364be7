/* AVX-512 VNNI integer products on the row-interleaved layouts (intdot.c), in quant.h's one order.
 *
 * The AVX2 kernels' loop (intdot_x86.h) with vpdpbusd on 256-bit vectors (AVX512-VL): each of a
 * block's 8 step vectors meets its 4 broadcast act codes in one instruction that multiplies the
 * unsigned codes by the signed act codes and adds each row's 4 products into that row's 32-bit
 * lane, where AVX2 needs vpmaddubsw, a 16-bit add and (once per block) vpmaddwd. The lanes hold
 * the same exact integers, and the float work after them is shared, so both paths give the same
 * bits. Q8_0's signed codes go in with 128 added (an XOR of the sign bit) and 128 times the act block's
 * code sum comes off in integers.
 *
 * Why 256-bit vectors: an earlier version put two steps in one 512-bit vector, which needs the act
 * codes permuted to match (one vpermd per vpdpbusd) and the halves added per block; on Zen 4, which
 * runs a 512-bit operation as two 256-bit ones, it was slower than the AVX2 kernels at decode
 * (1.5B, int8: 31 against 42 tok/s) and no faster at prefill.
 *
 * Compiled for the AVX-512 machines that have VNNI (cpu.c chooses it at run time). The tests
 * build this same file against SIMDe (QW_SIMDE, tests/test_avx512.py), which runs it on any CPU. */
#include "kernels.h"
#include "qblock.h"

#if defined(QW_SIMDE)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include "simde/x86/avx512.h"
#include "simde/x86/f16c.h"
#include "simde/x86/fma.h"
#define R8_TARGET
#define QW_BUILD_AVX512 1
#elif QW_HAVE_X86
#include <immintrin.h>
#define R8_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define QW_BUILD_AVX512 1
#else
#define QW_BUILD_AVX512 0
#endif

#if QW_BUILD_AVX512

#define R8_GETTER qw_r8_kernel_avx512
#include "intdot_x86.h"

/* Q8_0's codes made unsigned (code + 128); block_sum takes 128 times the act code sum off. */
R8_TARGET INLINE void unpack_q8(const uint8_t *codes, __m256i c[8]) {
    for (int s = 0; s < 8; s++) c[s] = _mm256_xor_si256(load32(codes + 32 * s), _mm256_set1_epi8((char)0x80));
}

/* acc plus the products of step vector c with the 4 act codes at x, broadcast to every row.
 * The broadcast is the instruction's own memory operand ({1to8}), which GCC does not fold from
 * the intrinsics: a separate broadcast load per step was 16 of the 75 instructions of a Q4_K
 * int16 sub-block at one act row, and taking them off made the one-row products 3-13% faster
 * with the weights in cache (Zen 4; Q4_K least). */
R8_TARGET INLINE __m256i dpbusd_bcast4(__m256i acc, __m256i c, const int8_t *x) {
#if defined(QW_SIMDE)
    return _mm256_dpbusd_epi32(acc, c, bcast4(x));
#else
    __asm__("vpdpbusd %2%{1to8%}, %1, %0" : "+v"(acc) : "v"(c), "m"(*(const struct { int8_t b[4]; } *)x));
    return acc;
#endif
}

/* Steps [first, first + n) of the block summed into each row's lane, in two chains (even and odd
 * steps): with one act row, a single chain of dependent vpdpbusd waited on its latency (1.5B
 * int8 decode 35 tok/s, below the AVX2 kernels' 44). */
R8_TARGET INLINE __m256i dot_steps(const __m256i c[8], const int8_t *x, int first, int n) {
    __m256i a = dpbusd_bcast4(_mm256_setzero_si256(), c[first], x + 4 * first);
    __m256i b = dpbusd_bcast4(_mm256_setzero_si256(), c[first + 1], x + 4 * first + 4);
    for (int s = first + 2; s < first + n; s += 2) {
        a = dpbusd_bcast4(a, c[s], x + 4 * s);
        b = dpbusd_bcast4(b, c[s + 1], x + 4 * s + 4);
    }
    return _mm256_add_epi32(a, b);
}

R8_TARGET INLINE __m256i block_sum(int T, const __m256i c[8], const int8_t *x, const int16_t *bs, __m256i *second) {
    switch (T) {
    case QW_Q4_0: return _mm256_sub_epi32(dot_steps(c, x, 0, 8), offset_sums(bs, 8));
    case QW_Q5_0: return _mm256_sub_epi32(dot_steps(c, x, 0, 8), offset_sums(bs, 16));
    case QW_Q8_0: return _mm256_sub_epi32(dot_steps(c, x, 0, 8), offset_sums(bs, 128));
    case QW_Q6_K:
        *second = _mm256_sub_epi32(dot_steps(c, x, 4, 4), q6_offset(bs, 1));
        return _mm256_sub_epi32(dot_steps(c, x, 0, 4), q6_offset(bs, 0));
    default: return dot_steps(c, x, 0, 8); /* Q4_1, Q5_1, Q4_K, Q5_K */
    }
}

/* ---------------------------------------------------------------- two act rows per vpdpbusd
 *
 * The wide kernels (qw_r8_kernel_avx512w) take act rows two at a time in 512-bit vectors: lane
 * 2r + i holds weight row r against act row i of the pair. Each step vector of the block has its
 * 32-bit lanes doubled (one vpermd per step, shared by all pairs), and the act side comes as pair
 * rows (kernels.h): two act rows interleaved 4 bytes at a time, so that a step's 4 + 4 codes, a
 * block's two scales and its two rows' offset sums are each one 64-bit broadcast load. A lane meets
 * the same integers and the same float operations in the same order as in the 256-bit kernels,
 * so every path still gives the same bits. This does twice the products per instruction for
 * prefill and batched decode, which pays where a 512-bit vpdpbusd runs at about the 256-bit one's
 * rate (the Intel Xeon measured, cpu.c); a lone act row (decode) keeps the 256-bit loop and the
 * plain act rows. */

R8_TARGET INLINE __m512i dup32(__m256i v) {
    return _mm512_permutexvar_epi32(_mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0),
                                    _mm512_castsi256_si512(v));
}

R8_TARGET INLINE __m512 dup32_ps(__m256 v) { return _mm512_castsi512_ps(dup32(_mm256_castps_si256(v))); }

/* The 8 bytes at p (a's 4, b's 4) in every 64-bit lane. */
R8_TARGET INLINE __m512i bcast8(const uint8_t *p) {
    long long v;
    memcpy(&v, p, 8);
    return _mm512_set1_epi64(v);
}

/* Where a field of a plain act row (at offset f - h in a row starting at h) is in a pair row
 * starting at h. */
#define PAIRED(h, f) ((const uint8_t *)(h) + 2 * ((const uint8_t *)(f) - (const uint8_t *)(h)))

/* start plus the pair's products over steps [first, first + n) of the block, in two chains. */
R8_TARGET INLINE __m512i dot_steps_pair(__m512i start, const __m512i C[8], const uint8_t *x, int first, int n) {
    __m512i a = _mm512_dpbusd_epi32(start, C[first], bcast8(x + 8 * first));
    __m512i b = _mm512_dpbusd_epi32(_mm512_setzero_si512(), C[first + 1], bcast8(x + 8 * first + 8));
    for (int s = first + 2; s < first + n; s += 2) {
        a = _mm512_dpbusd_epi32(a, C[s], bcast8(x + 8 * s));
        b = _mm512_dpbusd_epi32(b, C[s + 1], bcast8(x + 8 * s + 8));
    }
    return _mm512_add_epi32(a, b);
}

/* unpack_sub for the pair kernels: the step vectors and scales with their lanes doubled. */
R8_TARGET INLINE void unpack_wide(const int T, const uint8_t *rec, int j, __m256 D, __m256 Dmin, __m512i C[8],
                                  __m512 *S16, __m512 *SB16, __m256 *Mv) {
    __m256i c[8];
    __m256 S, Sb;
    unpack_sub(T, rec, j, D, Dmin, c, &S, &Sb, Mv);
    for (int s = 0; s < 8; s++) C[s] = dup32(c[s]);
    *S16 = dup32_ps(S);
    *SB16 = dup32_ps(Sb);
}

/* log2 of the code offset of Q4_0 (8), Q5_0 (16), Q8_0 (128) and Q6_K (32); 0 for the others. */
INLINE int offset_shift(const int T) {
    return T == QW_Q4_0 ? 3 : T == QW_Q5_0 ? 4 : T == QW_Q8_0 ? 7 : T == QW_Q6_K ? 5 : 0;
}

/* 256 I1 + I2 from a pair's four chains: level 1's even and odd steps, then level 2's. */
R8_TARGET INLINE __m512i join_levels(const __m512i s[4]) {
    return _mm512_add_epi32(_mm512_slli_epi32(_mm512_add_epi32(s[0], s[1]), 8), _mm512_add_epi32(s[2], s[3]));
}

/* The joined sums (256 I1 + I2, the code offsets taken off as level 2's start) of 16-bit pair
 * rows for n pairs at once (1 or 2; not Q6_K, whose two groups pair_sum takes), each level in
 * two chains, the pairs' chains interleaved step by step: the same integers whatever n. Written
 * pair after pair, the 512-bit vpdpbusd (which shares its two pipes with the float multiplies of
 * the sums' scaling) stayed further from its rate: on a 2-core Zen 4, 128 act rows against the
 * demo's Q5_0 gate took 3.32-3.47 ms and 3.17-3.23 with two pairs interleaved (two threads,
 * alternating), and a 512-token prefill of the 1.5B (Q4_K gate and up) went from 112-115 to
 * 117-121 tok/s. */
R8_TARGET INLINE void joined_sums(const int T, const int n, const __m512i C[8], const uint8_t *const h1[],
                                  const uint8_t *const hl[], int64_t K, int64_t b, __m512i out[]) {
    const int sh = offset_shift(T);
    const __m512i zero = _mm512_setzero_si512();
    const uint8_t *c1[2], *cl[2];
    __m512i s[2][4];
    for (int q = 0; q < n; q++) {
        const int8_t *x1 = (const int8_t *)h1[q], *xl = (const int8_t *)hl[q];
        c1[q] = PAIRED(h1[q], x1 + 32 * b);
        cl[q] = PAIRED(hl[q], xl + 32 * b);
        const __m512i fl = bcast8(PAIRED(hl[q], ACT_BSUMS(xl, K) + 2 * b)); /* the negated sums */
        s[q][0] = s[q][1] = s[q][3] = zero;
        s[q][2] = sh ? _mm512_slli_epi32(fl, sh) : zero;
    }
    for (int st = 0; st < 8; st += 2)
        for (int q = 0; q < n; q++) {
            s[q][0] = _mm512_dpbusd_epi32(s[q][0], C[st], bcast8(c1[q] + 8 * st));
            s[q][1] = _mm512_dpbusd_epi32(s[q][1], C[st + 1], bcast8(c1[q] + 8 * st + 8));
            s[q][2] = _mm512_dpbusd_epi32(s[q][2], C[st], bcast8(cl[q] + 8 * st));
            s[q][3] = _mm512_dpbusd_epi32(s[q][3], C[st + 1], bcast8(cl[q] + 8 * st + 8));
        }
    for (int q = 0; q < n; q++) out[q] = join_levels(s[q]);
}

/* row_sum for a pair, its level 1 a pair row's half starting at h1 and its last level one at hl.
 * The code offsets come off as the sums' starts, from the pair rows' negated code sums
 * (kernels.h): for 8-bit rows the offset times them (vpmaddwd), for 16-bit rows the joined
 * sums shifted by the offset's log2, at the start of level 2's sum, which is joined after level
 * 1's is shifted. A chain through both levels would be shorter by one add, but twice as long:
 * on the Xeon measured its latency cost 13% of a Q4_K product. Q6_K's second group goes to
 * *ib. */
R8_TARGET INLINE __m512i pair_sum(const int T, const int levels, const __m512i C[8], const uint8_t *h1,
                                  const uint8_t *hl, int64_t K, int64_t b, __m512i *ib) {
    const int8_t *x1 = (const int8_t *)h1, *xl = (const int8_t *)hl;
    const uint8_t *c1 = PAIRED(h1, x1 + 32 * b), *cl = PAIRED(hl, xl + 32 * b);
    const __m512i f1 = bcast8(PAIRED(h1, ACT_BSUMS(x1, K) + 2 * b)); /* the negated sums */
    const int sh = offset_shift(T);
    const __m512i zero = _mm512_setzero_si512();
    if (levels == 1) {
        if (T == QW_Q6_K) { /* each 16-value group's sum times the offset: (0, off), then (off, 0) */
            *ib = dot_steps_pair(_mm512_madd_epi16(f1, _mm512_set1_epi32((1 << sh) << 16)), C, c1, 4, 4);
            return dot_steps_pair(_mm512_madd_epi16(f1, _mm512_set1_epi32(1 << sh)), C, c1, 0, 4);
        }
        return dot_steps_pair(sh ? _mm512_madd_epi16(f1, _mm512_set1_epi16((short)(1 << sh))) : zero, C, c1, 0, 8);
    }
    if (T == QW_Q6_K) { /* f1: the low group's joined sum, fl the block's */
        const __m512i fl = bcast8(PAIRED(hl, ACT_BSUMS(xl, K) + 2 * b));
        const __m512i ia = dot_steps_pair(zero, C, c1, 0, 4), ja = dot_steps_pair(zero, C, c1, 4, 4);
        *ib = _mm512_add_epi32(_mm512_slli_epi32(ja, 8),
                               dot_steps_pair(_mm512_slli_epi32(_mm512_sub_epi32(fl, f1), sh), C, cl, 4, 4));
        return _mm512_add_epi32(_mm512_slli_epi32(ia, 8), dot_steps_pair(_mm512_slli_epi32(f1, sh), C, cl, 0, 4));
    }
    __m512i sum;
    joined_sums(T, 1, C, &h1, &hl, K, b, &sum);
    return sum;
}

/* A pair's block sums into its float sums, hl its last level's pair row: acc + I (S dx) (and
 * Q6_K's second group's Ib (Sb dx)). */
R8_TARGET INLINE void scale_into(const int T, __m512i ia, __m512i ib, __m512 S16, __m512 SB16, const uint8_t *hl,
                                 int64_t K, int64_t b, __m512 *acc) {
    const int8_t *xl = (const int8_t *)hl;
    const __m512 dx = _mm512_castsi512_ps(bcast8(PAIRED(hl, ACT_D(xl, K) + b)));
    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia), _mm512_mul_ps(S16, dx), *acc);
    if (T == QW_Q6_K) *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ib), _mm512_mul_ps(SB16, dx), *acc);
}

/* A pair's min sum for block b: macc + Mv s. */
R8_TARGET INLINE void min_into(__m512 MV16, const uint8_t *hl, int64_t K, int64_t b, __m512 *macc) {
    const int8_t *xl = (const int8_t *)hl;
    *macc = _mm512_fmadd_ps(MV16, _mm512_castsi512_ps(bcast8(PAIRED(hl, ACT_S(xl, K) + b))), *macc);
}

/* The three values as the compiler must take them where they are: not known to be the same as
 * before, so nothing computed from them is kept from one block to the next. */
INLINE void opaque(const uint8_t **x, size_t *a, size_t *b) {
#if defined(__GNUC__)
    __asm__("" : "+r"(*x), "+r"(*a), "+r"(*b));
#else
    (void)x, (void)a, (void)b;
#endif
}

/* Pair p's last level (for 16-bit rows the second half of its pair row): its d, s and code sums. */
INLINE const uint8_t *pair_last(const uint8_t *xq, size_t xstride, int64_t p, int levels, size_t half) {
    return xq + (size_t)p * xstride + 2 * (size_t)(levels - 1) * half;
}

/* product() for M act rows as pair rows (pair p at xq + p xstride; when M is odd the last pair's
 * second row is not stored). */
R8_TARGET INLINE void product_pairs(const int T, const int BITS, const uint8_t *g, int64_t K, const uint8_t *xq,
                                    size_t xstride, int64_t M, float *out) {
    const int bs = IS_K(T) ? 256 : 32, subs = bs / 32, levels = BITS == 16 ? 2 : 1;
    const int rb = record_bytes(T);
    const size_t half = ACT_HALF(K);
    const int64_t P = (M + 1) / 2;
    __m512 acc[QW_R8_MAX_M / 2], macc[QW_R8_MAX_M / 2];
    for (int64_t p = 0; p < P; p++) acc[p] = macc[p] = _mm512_setzero_ps();
    for (int64_t i = 0; i < K / bs; i++) {
        const uint8_t *rec = g + (size_t)i * (size_t)rb;
        __m256 Mv, Dmin;
        const __m256 D = record_scales(T, rec, &Mv, &Dmin);
        for (int j = 0; j < subs; j++) {
            const int64_t b = i * subs + j;
            qw_prefetch_share(rec, rb, subs, j);
            __m512i C[8];
            __m512 S16, SB16;
            unpack_wide(T, rec, j, D, Dmin, C, &S16, &SB16, &Mv);
            /* The pairs' rows from the block's own copies of their start, stride and level offset.
             * Left to the compiler, their 16 row pointers were computed once for the whole
             * product: more than the registers, they went to the stack and were read back every
             * block (33 loads per Q4_K block of 8 pairs), and loads are what this loop is short of
             * (broadcast loads to 512 bits go at two a cycle on the Zen 5, bench/vnni_rates.c, and
             * its 128 vpdpbusd take 136 of them). Recomputed per block they cost adds. Zen 5,
             * alternating builds: the 1.5B's 512-token prefill 230.8-244.5 -> 244.8-259.6 tok/s,
             * the demo's 16-row batched step 1-4% faster in each of 4 rounds. */
            const uint8_t *x0 = xq;
            size_t xs = xstride, lh = half;
            opaque(&x0, &xs, &lh);
            /* unrolled, so that with P a constant (below) each pair's sums stay in registers
             * instead of a stack slot read and written per block (Q4_K int16: +13-26% per
             * product on the Xeon measured) */
            int64_t p = 0;
            if (levels == 2 && T != QW_Q6_K) { /* two pairs at a time (joined_sums); an odd last one below */
#pragma GCC unroll 4
                for (; p + 1 < P; p += 2) {
                    const uint8_t *h1[2] = {x0 + (size_t)p * xs, x0 + (size_t)(p + 1) * xs};
                    const uint8_t *hl[2] = {pair_last(x0, xs, p, 2, lh), pair_last(x0, xs, p + 1, 2, lh)};
                    __m512i ia[2];
                    joined_sums(T, 2, C, h1, hl, K, b, ia);
                    for (int q = 0; q < 2; q++) scale_into(T, ia[q], _mm512_setzero_si512(), S16, SB16, hl[q], K, b, &acc[p + q]);
                }
            }
#pragma GCC unroll 8
            for (; p < P; p++) {
                const uint8_t *h1 = x0 + (size_t)p * xs, *hl = pair_last(x0, xs, p, levels, lh);
                __m512i ib = _mm512_setzero_si512(); /* Q6_K's second group */
                const __m512i ia = pair_sum(T, levels, C, h1, hl, K, b, &ib);
                scale_into(T, ia, ib, S16, SB16, hl, K, b, &acc[p]);
            }
        }
    }
    /* The types with a min (Q4_K, Q5_K, Q4_1, Q5_1) sum their mins in a pass of their own over
     * the records' scales, the same FMAs in the same order as in the loop above. In that loop
     * their 8 pairs' min sums, beside the 8 pairs' sums, the 8 step vectors and the integer
     * chains, left the compiler more live vectors than the 32 registers and went to the stack
     * every block: on a Zen 5, one thread's Q4_K int16 product of 512 rows went from 59-61% to
     * 65-66% of the integer probe (int8 51-53% to 54-55%), and the 1.5B's 512-token prefill
     * from 224.5-234.5 to 242.0-247.9 tok/s (alternating builds). */
    if (HAS_MIN(T))
        for (int64_t i = 0; i < K / bs; i++) {
            const uint8_t *rec = g + (size_t)i * (size_t)rb;
            __m256 Mv, Dmin;
            (void)record_scales(T, rec, &Mv, &Dmin);
            for (int j = 0; j < subs; j++) {
                if (IS_K(T)) Mv = sub_mins(rec, j, Dmin);
                const __m512 MV16 = dup32_ps(Mv);
#pragma GCC unroll 8
                for (int64_t p = 0; p < P; p++)
                    min_into(MV16, pair_last(xq, xstride, p, levels, half), K, i * subs + j, &macc[p]);
            }
        }
    /* lanes 2r + i to out[(2p + i) 8 + r] */
    const __m512i split = _mm512_set_epi32(15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0);
    for (int64_t p = 0; p < P; p++) {
        __m512 r = acc[p];
        if (T == QW_Q4_1 || T == QW_Q5_1) r = _mm512_add_ps(acc[p], macc[p]);
        if (T == QW_Q4_K || T == QW_Q5_K) r = _mm512_sub_ps(acc[p], macc[p]);
        r = _mm512_permutexvar_ps(split, r);
        if (2 * p + 1 < M)
            _mm512_storeu_ps(out + 16 * p, r);
        else
            _mm256_storeu_ps(out + 16 * p, _mm512_castps512_ps256(r));
    }
}

/* ---------------------------------------------------------------- two groups per act broadcast
 *
 * For the types whose codes carry an offset and no min (Q4_0, Q5_0), 16-bit rows, 8 or 16 act
 * rows: two repacked groups (16 weight rows) at once, so that each broadcast of a pair's act codes
 * (and each pair's offset sums and scales) serves both groups' step vectors. product_pairs spends a
 * broadcast load per vpdpbusd, plus the offset and scale loads per pair and block; here about half
 * of one. Both groups' step vectors take 16 of the 32 registers and each pair's chains 8 more, so
 * the pairs' float sums live on the stack (a load and a store per pair, group and block). A lane
 * meets the same integers and float operations in the same order as in product_pairs, so the
 * bits are the same. One thread, Zen 5, alternating: the demo's Q5_0 products at 16 rows 5-11%
 * faster, its up projection at 512 rows 8%; Q4_K (no offset) gained nothing (the 1.5B's up
 * projection at 512 rows 1.00x, its query projection 0.96x), nor the Q8_0 head (0.99x). */
R8_TARGET INLINE void product_pairs2(const int T, const uint8_t *g, int64_t K, const uint8_t *xq, size_t xstride,
                                     const int M, float *out) {
    const int rb = record_bytes(T), P = M / 2, sh = offset_shift(T);
    const size_t half = ACT_HALF(K), gb = (size_t)(K / 32) * (size_t)rb;
    __m512 acc[2][QW_R8_MAX_M / 2];
    for (int p = 0; p < P; p++) acc[0][p] = acc[1][p] = _mm512_setzero_ps();
    for (int64_t b = 0; b < K / 32; b++) {
        __m512i C[2][8];
        __m512 S16[2];
        for (int h = 0; h < 2; h++) {
            const uint8_t *rec = g + (size_t)h * gb + (size_t)b * (size_t)rb;
            qw_prefetch_share(rec, rb, 1, 0);
            __m256 Mv, Dmin;
            __m512 SB16; /* Q6_K's second group: none here */
            const __m256 D = record_scales(T, rec, &Mv, &Dmin);
            unpack_wide(T, rec, 0, D, Dmin, C[h], &S16[h], &SB16, &Mv);
        }
        const uint8_t *x0 = xq;
        size_t xs = xstride, lh = half;
        opaque(&x0, &xs, &lh);
#pragma GCC unroll 8
        for (int p = 0; p < P; p++) {
            const uint8_t *h1 = x0 + (size_t)p * xs, *hl = pair_last(x0, xs, p, 2, lh);
            const int8_t *x1 = (const int8_t *)h1, *xl = (const int8_t *)hl;
            const uint8_t *c1 = PAIRED(h1, x1 + 32 * b), *cl = PAIRED(hl, xl + 32 * b);
            /* level 2's start: the negated joined code sums times the offset (joined_sums) */
            const __m512i start = _mm512_slli_epi32(bcast8(PAIRED(hl, ACT_BSUMS(xl, K) + 2 * b)), sh);
            __m512i s[2][4];
            for (int h = 0; h < 2; h++) {
                s[h][0] = s[h][1] = s[h][3] = _mm512_setzero_si512();
                s[h][2] = start;
            }
            for (int st = 0; st < 8; st += 2) {
                const __m512i e1 = bcast8(c1 + 8 * st), o1 = bcast8(c1 + 8 * st + 8);
                const __m512i e2 = bcast8(cl + 8 * st), o2 = bcast8(cl + 8 * st + 8);
                for (int h = 0; h < 2; h++) {
                    s[h][0] = _mm512_dpbusd_epi32(s[h][0], C[h][st], e1);
                    s[h][1] = _mm512_dpbusd_epi32(s[h][1], C[h][st + 1], o1);
                    s[h][2] = _mm512_dpbusd_epi32(s[h][2], C[h][st], e2);
                    s[h][3] = _mm512_dpbusd_epi32(s[h][3], C[h][st + 1], o2);
                }
            }
            for (int h = 0; h < 2; h++)
                scale_into(T, join_levels(s[h]), _mm512_setzero_si512(), S16[h], S16[h], hl, K, b, &acc[h][p]);
        }
    }
    /* lanes 2r + i to out[(h M + 2p + i) 8 + r] */
    const __m512i split = _mm512_set_epi32(15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0);
    for (int h = 0; h < 2; h++)
        for (int p = 0; p < P; p++) _mm512_storeu_ps(out + (size_t)(h * M + 2 * p) * 8, _mm512_permutexvar_ps(split, acc[h][p]));
}

#define TWO(T, NAME)                                                                                            \
    R8_TARGET static void r8t_##NAME(const uint8_t *g, int64_t K, const uint8_t *xq, size_t xs, int64_t M,       \
                                     float *out) {                                                              \
        if (M == 16)                                                                                            \
            product_pairs2(T, g, K, xq, xs, 16, out);                                                           \
        else                                                                                                    \
            product_pairs2(T, g, K, xq, xs, 8, out);                                                            \
    }
TWO(QW_Q4_0, q4_0)
TWO(QW_Q5_0, q5_0)

qw_r8_two_fn qw_r8_kernel_avx512w2(int dtype, int bits) {
    if (bits != 16) return NULL;
    return dtype == QW_Q4_0 ? r8t_q4_0 : dtype == QW_Q5_0 ? r8t_q5_0 : NULL;
}

#define WIDE(T, NAME, BITS)                                                                                     \
    R8_TARGET static void r8w_##NAME##_##BITS(const uint8_t *g, int64_t K, const uint8_t *xq, size_t xs,         \
                                              int64_t M, float *out) {                                          \
        /* the row counts of full calls (prefill's rounds of 16, a batch of 8) as constants */                \
        if (M == 16)                                                                                            \
            product_pairs(T, BITS, g, K, xq, xs, 16, out);                                                      \
        else if (M == 8)                                                                                        \
            product_pairs(T, BITS, g, K, xq, xs, 8, out);                                                       \
        else                                                                                                    \
            product_pairs(T, BITS, g, K, xq, xs, M, out);                                                       \
    }
#define WIDES(T, NAME) WIDE(T, NAME, 8) WIDE(T, NAME, 16)
R8_TYPES(WIDES)

qw_r8_fn qw_r8_kernel_avx512w(int dtype, int bits) {
#define CASE(T, NAME) case T: return bits == 16 ? r8w_##NAME##_16 : r8w_##NAME##_8;
    switch (dtype) {
    R8_TYPES(CASE)
    default: return NULL;
    }
#undef CASE
}

#else
qw_r8_fn qw_r8_kernel_avx512(int dtype, int bits) {
    (void)dtype;
    (void)bits;
    return NULL;
}
qw_r8_fn qw_r8_kernel_avx512w(int dtype, int bits) {
    (void)dtype;
    (void)bits;
    return NULL;
}
qw_r8_two_fn qw_r8_kernel_avx512w2(int dtype, int bits) {
    (void)dtype;
    (void)bits;
    return NULL;
}
#endif
