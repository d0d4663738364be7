/* AVX2 integer products on the row-interleaved layouts (intdot.c), in quant.h's one order.
 *
 * A record's 32-value block is unpacked once into 8 "step" vectors of unsigned (Q8_0: signed)
 * codes, 4 consecutive codes of each of the 8 rows per vector, and serves every act row of the
 * product: for each, 8 vpmaddubsw by 4 broadcast act codes sum code pairs into 16-bit lanes
 * (two lanes per row), vpmaddwd folds each row's two lanes into one 32-bit lane, so a vector
 * holds the 8 rows' exact block sums with no horizontal reduction; one conversion and one FMA
 * per block (two for Q6_K's two groups) then update the 8 rows' float sums.
 *
 * No 16-bit lane can overflow: a vpmaddubsw lane is at most 2 * 15 * 127 = 3810 for 4-bit codes
 * (8 steps summed: 30480), 2 * 31 * 127 = 7874 for 5-bit codes (4 steps: 31496), 2 * 63 * 127 =
 * 16002 for 6-bit codes (2 steps: 32004), and 2 * 128 * 127 = 32512 for Q8_0's |code| (taken one
 * step at a time, its sign moved onto the act codes with vpsignb). */
#include "kernels.h"
#include "qblock.h"

#if QW_HAVE_X86
#include <immintrin.h>

#define R8_TARGET QW_TARGET_AVX2
#define R8_GETTER qw_r8_kernel_avx2
#include "intdot_x86.h"

/* Ends the compiler's freedom to reassociate a chain of integer adds here: it otherwise turns
 * the chains into trees, every product live at once, and spills most of them to the stack (the
 * first joined kernels ran 25-30% slower without it; the byte-product chains below gained 7-8% with it
 * in 8-bit products of 512 rows on a Zen 3). Integer adds: the same sums in any order. */
#define CHAIN(v) __asm__("" : "+x"(v))

/* Q8_0's codes stay signed: sum8 takes their magnitudes and moves their signs onto the act. */
R8_TARGET INLINE void unpack_q8(const uint8_t *codes, __m256i c[8]) {
    for (int s = 0; s < 8; s++) c[s] = load32(codes + 32 * s);
}

/* ---------------------------------------------------------------- block sums */

R8_TARGET INLINE __m256i sum4(const __m256i c[8], const int8_t *x) {
    __m256i p = _mm256_maddubs_epi16(c[0], bcast4(x));
    for (int s = 1; s < 8; s++) {
        p = _mm256_add_epi16(p, _mm256_maddubs_epi16(c[s], bcast4(x + 4 * s)));
        CHAIN(p);
    }
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

R8_TARGET INLINE __m256i sum5(const __m256i c[8], const int8_t *x) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i a = _mm256_maddubs_epi16(c[0], bcast4(x)), b = _mm256_maddubs_epi16(c[4], bcast4(x + 16));
    for (int s = 1; s < 4; s++) {
        a = _mm256_add_epi16(a, _mm256_maddubs_epi16(c[s], bcast4(x + 4 * s)));
        b = _mm256_add_epi16(b, _mm256_maddubs_epi16(c[s + 4], bcast4(x + 16 + 4 * s)));
        CHAIN(a);
        CHAIN(b);
    }
    return _mm256_add_epi32(_mm256_madd_epi16(a, ones), _mm256_madd_epi16(b, ones));
}

/* Q6_K: steps 0-3 are group a, 4-7 group b (into *b), summed two steps at a time. */
R8_TARGET INLINE __m256i sum6(const __m256i c[8], const int8_t *x, __m256i *b) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i t[4];
    for (int u = 0; u < 4; u++)
        t[u] = _mm256_add_epi16(_mm256_maddubs_epi16(c[2 * u], bcast4(x + 8 * u)),
                                _mm256_maddubs_epi16(c[2 * u + 1], bcast4(x + 8 * u + 4)));
    *b = _mm256_add_epi32(_mm256_madd_epi16(t[2], ones), _mm256_madd_epi16(t[3], ones));
    return _mm256_add_epi32(_mm256_madd_epi16(t[0], ones), _mm256_madd_epi16(t[1], ones));
}

/* Q8_0: signed codes c as |c| with c's sign moved onto the act codes. */
R8_TARGET INLINE __m256i sum8(const __m256i c[8], const int8_t *x) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc = _mm256_setzero_si256();
    for (int s = 0; s < 8; s++) {
        __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(c[s]), _mm256_sign_epi8(bcast4(x + 4 * s), c[s]));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
        CHAIN(acc);
    }
    return acc;
}

R8_TARGET INLINE __m256i block_sum(int T, const __m256i c[8], const int8_t *x, const int16_t *bs, __m256i *second) {
    switch (T) {
    case QW_Q4_0: return _mm256_sub_epi32(sum4(c, x), offset_sums(bs, 8));
    case QW_Q4_1: case QW_Q4_K: return sum4(c, x);
    case QW_Q5_0: return _mm256_sub_epi32(sum5(c, x), offset_sums(bs, 16));
    case QW_Q5_1: case QW_Q5_K: return sum5(c, x);
    case QW_Q8_0: return sum8(c, x);
    default: {
        __m256i b, a = sum6(c, x, &b);
        *second = _mm256_sub_epi32(b, q6_offset(bs, 1));
        return _mm256_sub_epi32(a, q6_offset(bs, 0));
    }
    }
}

/* ---------------------------------------------------------------- joined 16-bit rows
 *
 * A 16-bit act row's two levels cost two vpmaddubsw per code pair of a row, and their joining,
 * offsets and (Q6_K) two-step folds as much again. On joined rows (kernels.h: each value's
 * 256 q1 + q2 as one int16) one vpmaddwd takes two codes against two values: the block's 8 step
 * vectors are widened once to 16 vectors of 16-bit code pairs, offsets taken off there (and
 * Q8_0's signs kept), for all the product's act rows (the vertical kernels below). A pair's
 * products stay far inside int32: |c| <= 128, |256 q1 + q2| <= 32639, 32 of them per block. The
 * sums are the same integers as the two levels' (256 I1 + I2), the float work after them the
 * same, so the bits are too. An 8-bit row joined the same way (j = q) ran at two thirds of the
 * plain 8-bit kernel's rate: one level's byte products cost less than the widening and twice the
 * multiply-adds, so 8-bit rows stay plain. */

/* Sub-block j's codes as 16-bit pairs: w[2s] holds codes 4s and 4s + 2 of each row, w[2s + 1]
 * codes 4s + 1 and 4s + 3 (the order of the joined rows' values), offsets taken off. */
R8_TARGET INLINE void widen(const int T, const __m256i c[8], __m256i w[16]) {
    const __m256i even = _mm256_set1_epi32(0x00FF00FF);
    const __m256i off = _mm256_set1_epi16(T == QW_Q4_0 ? 8 : T == QW_Q5_0 ? 16 : T == QW_Q6_K ? 32 : 0);
    for (int s = 0; s < 8; s++) {
        if (T == QW_Q8_0) { /* signed bytes: sign-extended from either half of a 16-bit lane */
            w[2 * s] = _mm256_srai_epi16(_mm256_slli_epi16(c[s], 8), 8);
            w[2 * s + 1] = _mm256_srai_epi16(c[s], 8);
        } else {
            w[2 * s] = _mm256_sub_epi16(_mm256_and_si256(c[s], even), off);
            w[2 * s + 1] = _mm256_sub_epi16(_mm256_srli_epi16(c[s], 8), off);
        }
    }
}


/* ---------------------------------------------------------------- vertical blocks
 *
 * The same products with the roles of the vector lanes turned: a vector holds one weight row's
 * sums with 8 act rows (a vertical block, qblock.h), each widened weight pair broadcast from the
 * block's widened codes in memory. Per pair of codes a tile of 4 weight rows and 2 blocks loads 2
 * act vectors and broadcasts 4 weight pairs for 8 vpmaddwd, where the earlier kernels (8 weight
 * rows to a vector, now gone) broadcast an act pair for each: in a timing of the two loops alone
 * (L1, one thread, same float work) 3.9-4.4 against 2.7-2.9 G vpmaddwd a second on a Zen 3.
 * Each lane's integer sums are the two-level kernels' (256 I1 + I2) and its float work
 * the same operations on the same values (the scales' product S_r dx_m, the FMA into its sum,
 * the mins' Mv_r s_m), so the bits are the same. */

/* Weight rows r0 .. r0 + 3 of sub-block b (widened pairs wb: [16 pairs][8 rows]) against the G
 * blocks x: each lane's exact sums per group of pairs (Q6_K: two of 8), then its float work. */
R8_TARGET INLINE void vertical_tile(const int T, const int G, const int32_t *wb, int r0, const uint8_t *const *x,
                                    int64_t b, const float *Sa, const float *Sba, const __m256 *dx, __m256 acc[8][2]) {
    const int groups = T == QW_Q6_K ? 2 : 1, n = 16 / groups;
    for (int gr = 0; gr < groups; gr++) {
        const int k0 = gr * n;
        __m256i c[4][2], xv[2];
        for (int g = 0; g < G; g++) xv[g] = _mm256_loadu_si256((const __m256i *)(VERT_PAIRS(x[g], b) + 8 * k0));
        for (int r = 0; r < 4; r++) {
            const __m256i wr = _mm256_set1_epi32(wb[8 * k0 + r0 + r]);
            for (int g = 0; g < G; g++) c[r][g] = _mm256_madd_epi16(wr, xv[g]);
        }
#pragma GCC unroll 16
        for (int k = k0 + 1; k < k0 + n; k++) {
            for (int g = 0; g < G; g++) xv[g] = _mm256_loadu_si256((const __m256i *)(VERT_PAIRS(x[g], b) + 8 * k));
            for (int r = 0; r < 4; r++) {
                const __m256i wr = _mm256_set1_epi32(wb[8 * k + r0 + r]);
                for (int g = 0; g < G; g++) {
                    c[r][g] = _mm256_add_epi32(c[r][g], _mm256_madd_epi16(wr, xv[g]));
                    CHAIN(c[r][g]);
                }
            }
        }
        const float *scale = gr ? Sba : Sa;
        for (int r = 0; r < 4; r++)
            for (int g = 0; g < G; g++)
                acc[r0 + r][g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c[r][g]),
                                                 _mm256_mul_ps(_mm256_broadcast_ss(scale + r0 + r), dx[g]), acc[r0 + r][g]);
    }
}

/* The same for a single block (6-8 act rows: batched decode) and all 8 weight rows in one tile,
 * so each act vector is loaded once for 8 weight pairs. It is a function of its own: the tile
 * above, given the row count as an argument instead, kept the two-block tiles' chains in memory
 * (16 act rows: 25% slower). */
R8_TARGET INLINE void vertical_tile8(const int T, const int32_t *wb, const uint8_t *x, int64_t b, const float *Sa,
                                     const float *Sba, __m256 dx, __m256 acc[8][2]) {
    const int groups = T == QW_Q6_K ? 2 : 1, n = 16 / groups;
    for (int gr = 0; gr < groups; gr++) {
        const int k0 = gr * n;
        __m256i c[8];
        __m256i xv = _mm256_loadu_si256((const __m256i *)(VERT_PAIRS(x, b) + 8 * k0));
        for (int r = 0; r < 8; r++) c[r] = _mm256_madd_epi16(_mm256_set1_epi32(wb[8 * k0 + r]), xv);
#pragma GCC unroll 16
        for (int k = k0 + 1; k < k0 + n; k++) {
            xv = _mm256_loadu_si256((const __m256i *)(VERT_PAIRS(x, b) + 8 * k));
            for (int r = 0; r < 8; r++) {
                c[r] = _mm256_add_epi32(c[r], _mm256_madd_epi16(_mm256_set1_epi32(wb[8 * k + r]), xv));
                CHAIN(c[r]);
            }
        }
        const float *scale = gr ? Sba : Sa;
        for (int r = 0; r < 8; r++)
            acc[r][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c[r]), _mm256_mul_ps(_mm256_broadcast_ss(scale + r), dx),
                                        acc[r][0]);
    }
}

#define MIN_RUN 32

/* The mins' sums of sub-blocks b0 .. b0 + n - 1 (weight mins per sub-block in mins[]). */
R8_TARGET INLINE void min_run(const int G, const uint8_t *const *x, int64_t K, int64_t b0, int n,
                              const float mins[][8], __m256 macc[8][2]) {
    for (int g = 0; g < G; g++) {
        __m256 m[8];
        for (int r = 0; r < 8; r++) m[r] = macc[r][g];
        for (int t = 0; t < n; t++) {
            const __m256 sv = _mm256_loadu_ps(VERT_S(x[g], K) + 8 * (b0 + t));
            for (int r = 0; r < 8; r++) m[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(mins[t] + r), sv, m[r]);
        }
        for (int r = 0; r < 8; r++) macc[r][g] = m[r];
    }
}

R8_TARGET INLINE void product_vertical(const int T, const int G, const uint8_t *g, int64_t K, const uint8_t *xv,
                                       size_t vstride, int64_t M, float *out) {
    const int bs = IS_K(T) ? 256 : 32, subs = bs / 32;
    const int rb = record_bytes(T);
    const uint8_t *x[2] = {xv, xv + vstride};
    __m256 acc[8][2], macc[8][2];
    for (int r = 0; r < 8; r++) acc[r][0] = acc[r][1] = macc[r][0] = macc[r][1] = _mm256_setzero_ps();
    /* The mins' products wait for MIN_RUN sub-blocks and then run with their sums in registers:
     * folded in per sub-block they were loads and stores of sums the tiles leave no registers
     * for. Each lane's FMAs are the same, in the same order. */
    float mins[MIN_RUN][8] __attribute__((aligned(32)));
    int64_t run0 = 0;
    for (int64_t i = 0; i < K / bs; i++) {
        const uint8_t *rec = g + (size_t)i * (size_t)rb;
        __m256 Mv, Dmin;
        const __m256 D = record_scales(T, rec, &Mv, &Dmin);
        for (int j = 0; j < subs; j++) {
            const int64_t b = i * subs + j;
            qw_prefetch_share(rec, rb, subs, j);
            __m256i c[8], w[16];
            __m256 S, Sb;
            unpack_sub(T, rec, j, D, Dmin, c, &S, &Sb, &Mv);
            widen(T, c, w);
            int32_t wb[16 * 8] __attribute__((aligned(32)));
            float Sa[8], Sba[8];
            for (int k = 0; k < 16; k++) _mm256_store_si256((__m256i *)(wb + 8 * k), w[k]);
            /* the pairs are then broadcast from memory (a load each): left to see the stores, the
             * compiler took them out of the vectors with shifts and shuffles instead, on the
             * pipes the multiply-adds need (the Q4_K product 25% slower than the joined one) */
            __asm__ volatile("" : : "r"(wb) : "memory");
            _mm256_storeu_ps(Sa, S);
            _mm256_storeu_ps(Sba, Sb);
            __m256 dx[2];
            for (int gg = 0; gg < G; gg++) dx[gg] = _mm256_loadu_ps(VERT_D(x[gg], K) + 8 * b);
            if (G == 1)
                vertical_tile8(T, wb, x[0], b, Sa, Sba, dx[0], acc);
            else {
                vertical_tile(T, G, wb, 0, x, b, Sa, Sba, dx, acc);
                vertical_tile(T, G, wb, 4, x, b, Sa, Sba, dx, acc);
            }
            if (HAS_MIN(T)) {
                _mm256_store_ps(mins[b - run0], Mv);
                if (b - run0 == MIN_RUN - 1 || b == K / 32 - 1) {
                    min_run(G, x, K, run0, (int)(b + 1 - run0), mins, macc);
                    run0 = b + 1;
                }
            }
        }
    }
    /* lane l of row r's vector of block gg is act row 8 gg + l: out[m * 8 + r] */
    for (int gg = 0; gg < G; gg++)
        for (int r = 0; r < 8; r++) {
            float lanes[8];
            _mm256_storeu_ps(lanes, with_mins(T, acc[r][gg], macc[r][gg]));
            for (int l = 0; l < 8 && 8 * gg + l < M; l++) out[(8 * gg + l) * 8 + r] = lanes[l];
        }
}

#define VERTICAL_KERNEL(T, NAME)                                                                                \
    R8_TARGET static void r8_##NAME##_vertical(const uint8_t *g, int64_t K, const uint8_t *xv, size_t vs,        \
                                               int64_t M, float *out) {                                         \
        if (M <= 8)                                                                                             \
            product_vertical(T, 1, g, K, xv, vs, M, out);                                                       \
        else                                                                                                    \
            product_vertical(T, 2, g, K, xv, vs, M, out);                                                       \
    }
R8_TYPES(VERTICAL_KERNEL)

qw_r8_fn qw_r8_kernel_vertical_avx2(int dtype) {
#define CASE(T, NAME) case T: return r8_##NAME##_vertical;
    switch (dtype) {
    R8_TYPES(CASE)
    default: return NULL;
    }
#undef CASE
}

#else
qw_r8_fn qw_r8_kernel_avx2(int dtype, int bits) {
    (void)dtype;
    (void)bits;
    return NULL;
}
qw_r8_fn qw_r8_kernel_vertical_avx2(int dtype) {
    (void)dtype;
    return NULL;
}
#endif /* QW_HAVE_X86 */
