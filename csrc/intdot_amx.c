/* AMX integer products: 16 act rows against 16 weight rows (two repacked 8-row groups) per tile
 * multiply, in quant.h's one order.
 *
 * A block's exact integer sums come from the tile unit instead of vpdpbusd: the act codes of 16
 * act rows are tile A (16 rows of a block's 32 codes, laid out as the tile is loaded: kernels.h's
 * AMX blocks; read in place from the plain rows, 16 rows 4-24 KiB apart, they made the product
 * only 9% faster than the 512-bit kernels),
 * the two groups' unpacked step vectors are tile B (step s, 4 codes per weight row, is B's row s:
 * the repacked layout is already what the tile unit wants), and C[m][r] is act row m's sum with
 * weight row r. The codes with an offset (Q4_0, Q5_0, Q6_K) are unpacked with it taken off, signed,
 * so that the sums need no correction (tdpbssd; Q8_0's codes are signed as stored); the others
 * stay unsigned (tdpbsud). These are the same integers the vpdpbusd kernels reach, a 16-bit row's
 * two levels joined the same way (256 I1 + I2), and the float work after them is the same
 * operations in the same order per output, so every path gives the same bits.
 *
 * One tile multiply does 16 x 16 x 32 products, where the 512-bit kernels need 16 vpdpbusd and
 * their chain adds per level for the same work; what is left on the vector units is a block's
 * float work (per output row: the level join, cvt, scale multiply and FMA) and the unpacking,
 * which is shared by all the act rows of a call. The mins of Q4_1, Q5_1, Q4_K and Q5_K depend on
 * no code, so they are summed in a loop of their own after each phase (the same FMAs in the same
 * order), which keeps the main loop's 16 accumulators in registers.
 *
 * 16-bit rows of the types with small codes can instead go on bf16 tiles, both levels in one
 * float C tile (below). Compiled for CPUs with AMX-INT8 and AMX-BF16 (cpu.c checks the CPU and
 * asks the kernel for the tile state at run time). */
#include "kernels.h"
#include "qblock.h"

#if QW_HAVE_X86 && !defined(QW_SIMDE)
#include <immintrin.h>
#define R8_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,amx-tile,amx-int8,amx-bf16")))
#define R8_UNPACK_ONLY
#include "intdot_x86.h"

/* Q8_0's codes as stored (signed): tdpbssd takes them as they are. */
R8_TARGET INLINE void unpack_q8(const uint8_t *codes, __m256i c[8]) {
    for (int s = 0; s < 8; s++) c[s] = load32(codes + 32 * s);
}

/* The code offset of the types that have one, taken off in the unpacking (0: unsigned codes). */
INLINE int code_offset(const int T) {
    return T == QW_Q4_0 ? 8 : T == QW_Q5_0 ? 16 : T == QW_Q6_K ? 32 : 0;
}

INLINE int signed_codes(const int T) { return code_offset(T) != 0 || T == QW_Q8_0; }

/* ---------------------------------------------------------------- tile configurations
 *
 * Config 0 (blocks of 32 codes): C tiles 0, 1 (levels 1, 2: 16 x 16 int32), A tiles 2, 3 (16
 * act rows x 32 codes), B tile 4 (8 steps x 16 weight rows x 4 codes).
 * Config 1 (Q6_K, groups of 16 codes): C tiles 0, 1 (level 1, groups 0 and 1), 2, 3 (level 2),
 * A tiles 4, 5 (levels 1, 2: 16 act rows x 16 codes), B tiles 6, 7 (4 steps each).
 * Config 2 (bf16, blocks of 32 values): C tile 0 (16 x 16 float, both levels), A tiles 2, 3
 * (levels 1, 2: 16 act rows x 32 values), B tile 4 (16 pairs x 16 weight rows x 2 values).
 * Config 3 (bf16, Q6_K): C tiles 0, 1 (groups 0, 1), A tiles 2, 3 (levels 1, 2: 16 act rows x
 * 16 values), B tiles 4, 5 (groups 0, 1: 8 pairs each). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* The tile loads and stores and the config load as asm that tells the compiler what memory they
 * touch: GCC 12's intrinsics declare only 8 bytes of the config read and no memory read by a tile
 * load, so the stores filling a config or tile B could be dropped or moved past them. */
#define TILE_LOAD(t, base, stride) \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"((const void *)(base)), "r"((long)(stride)) : "memory")
#define TILE_STORE(t, base, stride) \
    __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"((void *)(base)), "r"((long)(stride)) : "memory")

/* Loaded at a call unless the thread's tiles hold it already, as read back from the tile unit
 * (sttilecfg): another library in the process (a second copy of these kernels, a BLAS with AMX)
 * may configure the tiles of the same thread between two calls, and a configuration remembered
 * in a variable across calls then ran tile instructions on the wrong shapes (an invalid-opcode
 * fault). Loading it at every call, and releasing the tiles after each, cost 5-10% of the
 * demo's 16-row head product (K = 896: 28 blocks a call); the tiles are now released once a
 * product, by qw_amx_release_x86. */
static const tile_config configs[4] = {
    {.palette = 1, .colsb = {64, 64, 32, 32, 64}, .rows = {16, 16, 16, 16, 8}},
    {.palette = 1, .colsb = {64, 64, 64, 64, 16, 16, 64, 64}, .rows = {16, 16, 16, 16, 16, 16, 4, 4}},
    {.palette = 1, .colsb = {64, 0, 64, 64, 64}, .rows = {16, 0, 16, 16, 16}},
    {.palette = 1, .colsb = {64, 64, 32, 32, 64, 64}, .rows = {16, 16, 16, 16, 8, 8}},
};

R8_TARGET static void use_config(int which) {
    _Alignas(64) tile_config now;
    __asm__ volatile("sttilecfg %0" : "=m"(now));
    if (memcmp(&now, &configs[which], sizeof now) != 0) __asm__ volatile("ldtilecfg %0" ::"m"(configs[which]));
}

R8_TARGET void qw_amx_release_x86(void) { _tile_release(); }

/* ---------------------------------------------------------------- the product */

/* Two groups' step vectors side by side: B's row s is group 0's step s, then group 1's. */
R8_TARGET INLINE void put_steps(uint8_t *B, const __m256i c[8], int half) {
    for (int s = 0; s < 8; s++) _mm256_store_si256((__m256i *)(B + 64 * s + 32 * half), c[s]);
}

R8_TARGET INLINE void take_offset(const int T, __m256i c[8]) {
    const int off = code_offset(T);
    if (!off) return;
    const __m256i o = _mm256_set1_epi8((char)off);
    for (int s = 0; s < 8; s++) c[s] = _mm256_sub_epi8(c[s], o);
}

R8_TARGET INLINE __m512 join_ps(__m256 lo, __m256 hi) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}

/* C tile t's product of A tile a and B tile b: the signed or unsigned form for the codes. */
#define DP(T, t, a, b)                       \
    do {                                     \
        if (signed_codes(T))                 \
            _tile_dpbssd(t, a, b);           \
        else                                 \
            _tile_dpbsud(t, a, b);           \
    } while (0)

/* The sums of the 16 act rows of AMX block record x (kernels.h) with the 16 rows of groups g0
 * and g1 (g1 NULL: zeros for rows 8-15) in tile B: C tiles stored to Cb (1 KiB each, in the
 * configurations' C order). (Even and odd blocks on tiles of their own, each block's C stores
 * after the next block's products, measured no faster.) */
R8_TARGET INLINE void block_tiles(const int T, const int levels, const uint8_t *B, const uint8_t *x, int32_t *Cb) {
    const uint8_t *x1 = x, *x2 = x + 512;
    if (T == QW_Q6_K) {
        TILE_LOAD(6, B, 64);
        TILE_LOAD(7, B + 256, 64);
        /* one level: C tiles c0, c1 (groups 0, 1) from act codes xp through A tile a */
#define Q6_LEVEL(c0, c1, a, xp)     \
    do {                            \
        _tile_zero(c0);             \
        _tile_zero(c1);             \
        TILE_LOAD(a, xp, 32);       \
        DP(T, c0, a, 6);            \
        TILE_LOAD(a, (xp) + 16, 32); \
        DP(T, c1, a, 7);            \
    } while (0)
        Q6_LEVEL(0, 1, 4, x1);
        if (levels == 2) Q6_LEVEL(2, 3, 5, x2);
#undef Q6_LEVEL
        TILE_STORE(0, Cb, 64);
        TILE_STORE(1, Cb + 256, 64);
        if (levels == 2) {
            TILE_STORE(2, Cb + 512, 64);
            TILE_STORE(3, Cb + 768, 64);
        }
        return;
    }
    TILE_LOAD(4, B, 64);
    _tile_zero(0);
    TILE_LOAD(2, x1, 32);
    DP(T, 0, 2, 4);
    if (levels == 2) {
        _tile_zero(1);
        TILE_LOAD(3, x2, 32);
        DP(T, 1, 3, 4);
    }
    TILE_STORE(0, Cb, 64);
    if (levels == 2) TILE_STORE(1, Cb + 256, 64);
}

/* Act row m's exact sum (a 16-bit row's levels joined, 256 I1 + I2) from C tiles stored at c1
 * (level 1) and c2 (level 2). */
R8_TARGET INLINE __m512i joined(const int levels, const int32_t *c1, const int32_t *c2, int m) {
    const __m512i i1 = _mm512_load_si512(c1 + 16 * m);
    if (levels == 1) return i1;
    return _mm512_add_epi32(_mm512_slli_epi32(i1, 8), _mm512_load_si512(c2 + 16 * m));
}

/* ---------------------------------------------------------------- 16-bit rows on bf16 tiles
 *
 * A tile store costs about as long as a tile multiply and, unlike the multiplies, runs alone: on
 * the Xeon measured, vector work after it waited for it, so a block's two int32 C tiles (one per
 * level) and their join cost more than the multiplies. A 16-bit row's block sum also fits a bf16
 * tile product exactly where the codes are small: with level 1 as the values 256 q1 and level 2
 * as q2 (each exact in bf16: at most 8 significant bits) and the weight codes as bf16, both
 * levels go into one float C tile, and every partial sum is an integer of at most 32 x 32639 x
 * 16 = 16,711,168 < 2^24 in magnitude (codes of at most 16: Q4_0, Q4_1, Q5_0, Q4_K; Q6_K's
 * 16-value groups of codes up to 32), so each is exact in float32 and C holds the integer sum
 * I = 256 I1 + I2 itself, as float(I): the same value the int32 kernels convert. One tile store
 * per block instead of two, and no join or conversion after it. */
#define BF16_TYPES(X) X(QW_Q4_0, q4_0) X(QW_Q4_1, q4_1) X(QW_Q5_0, q5_0) X(QW_Q4_K, q4_k) X(QW_Q6_K, q6_k)

/* 16 floats' bf16 (their high 16 bits: exact for the small integers the bf16 path holds). */
R8_TARGET INLINE __m256i bf16_hi(__m512 v) { return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16)); }

/* The bf16 of every code a type's unpacking gives (0-63, before its offset is taken off), as two
 * byte tables for vpermb indexed by the code: the low bytes, the high bytes. The offset is taken
 * off here, in the table, not in the codes. */
R8_TARGET INLINE void bf16_code_table(const int T, __m512i *lo, __m512i *hi) {
    const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    __m128i l[4], h[4]; /* codes 16 q .. 16 q + 15 */
    for (int q = 0; q < 4; q++) {
        const __m512i c = _mm512_add_epi32(iota, _mm512_set1_epi32(16 * q - code_offset(T)));
        const __m256i w = bf16_hi(_mm512_cvtepi32_ps(c));
        l[q] = _mm256_cvtepi16_epi8(w);
        h[q] = _mm256_cvtepi16_epi8(_mm256_srli_epi16(w, 8));
    }
    *lo = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(l[1], l[0])), _mm256_set_m128i(l[3], l[2]), 1);
    *hi = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(h[1], h[0])), _mm256_set_m128i(h[3], h[2]), 1);
}

/* Tile B for bf16 from the two groups' step vectors (codes as unpacked, offset not taken off):
 * step s holds codes 4s .. 4s + 3 of each row, so B's row 2s is pair (4s, 4s + 1) of group 0's 8
 * rows, then of group 1's, and row 2s + 1 pair (4s + 2, 4s + 3). Per step: both groups' codes in
 * one vector (16 rows x 4), looked up to bf16 low and high bytes, interleaved into words (per
 * 128-bit lane: rows 4l, 4l + 1 in the low half's words, 4l + 2, 4l + 3 in the high half's), then
 * each row's two pairs dealt to the two B rows. */
R8_TARGET INLINE void put_pairs(uint8_t *B, const __m256i c0[8], const __m256i c1[8], __m512i lo, __m512i hi) {
    const __m512i even = _mm512_set_epi32(30, 28, 14, 12, 26, 24, 10, 8, 22, 20, 6, 4, 18, 16, 2, 0);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    for (int s = 0; s < 8; s++) {
        const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(c0[s]), c1[s], 1);
        const __m512i L = _mm512_permutexvar_epi8(z, lo), H = _mm512_permutexvar_epi8(z, hi);
        const __m512i a = _mm512_unpacklo_epi8(L, H), b = _mm512_unpackhi_epi8(L, H);
        _mm512_store_si512((__m512i *)(B + 128 * s), _mm512_permutex2var_epi32(a, even, b));
        _mm512_store_si512((__m512i *)(B + 128 * s + 64), _mm512_permutex2var_epi32(a, odd, b));
    }
}

#include "act_avx512.h"

/* 16 float rows `ldx` values apart straight into an AMX block (kernels.h; with bf16, the bf16
 * kernels' form): the codes and scales act.c's quantizers give those rows (the same act_scale,
 * rounding and clamp), with no plain act rows in between (quantizing to plain rows and laying
 * them out after took a second pass over every act value). Level 1's code q1 is round(t) itself
 * (|t| <= 127 after act_scale), so the bf16 value 256 q1 needs no trip through an integer; zeros
 * are made +0, the bf16 an integer 0 gives. The code sums, whole numbers far below 2^24, are
 * exact as float sums in any order. A block's rows go in two passes: their maxima (all 16
 * reduced together, then each row's scale), then their codes and code sums (act_avx512.h). */

R8_TARGET void qw_amx_quantize_x86(const float *X, size_t ldx, int64_t n, int bits, int bf16, uint8_t *dst) {
    const int levels = bits == 16 ? 2 : 1;
    const size_t per = bf16 ? QW_AMX_ACT_BLOCK_BF16 : QW_AMX_ACT_BLOCK(bits), lsize = bf16 ? 1024 : 512;
    const __m512 k256 = _mm512_set1_ps(256.0f), zero = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / 32; b++) {
        uint8_t *rec = dst + (size_t)b * per;
        float *d = (float *)(rec + lsize * (size_t)levels), *s = d + 16;
        const float *xb = X + 32 * (size_t)b;
        __m512 ab[16], l1s[16], l2s[16];
        for (int m = 0; m < 16; m++) ab[red_at[m]] = amax_halves(xb + (size_t)m * ldx);
        _Alignas(64) float dd[16], idd[16];
        __m512 vdd, vidd;
        const __mmask16 finite = act_scale16(ab, &vdd, &vidd);
        _mm512_store_ps(dd, vdd);
        _mm512_store_ps(idd, vidd);
        for (int m = 0; m < 16; m++) {
            __m512 l1[2] = {zero, zero}, l2[2] = {zero, zero};
            if (finite >> m & 1) act_levels(xb + (size_t)m * ldx, _mm512_set1_ps(idd[m]), levels, l1, l2);
            l1s[red_at[m]] = _mm512_add_ps(l1[0], l1[1]);
            l2s[red_at[m]] = _mm512_add_ps(l2[0], l2[1]);
            for (int h = 0; h < 2; h++) {
                if (bf16) {
                    _mm256_storeu_si256((__m256i *)(rec + 64 * m + 32 * h), bf16_hi(_mm512_mul_ps(l1[h], k256)));
                    _mm256_storeu_si256((__m256i *)(rec + 1024 + 64 * m + 32 * h), bf16_hi(l2[h]));
                } else {
                    _mm_storeu_si128((__m128i *)(rec + 32 * m + 16 * h), codes16(l1[h]));
                    if (levels == 2) _mm_storeu_si128((__m128i *)(rec + 512 + 32 * m + 16 * h), codes16(l2[h]));
                }
            }
        }
        /* per row, as act.c: d = dd / 256 and s = d (256 s1 + s2) for 16 bits, else d = dd and
         * s = dd s1, the code sums s1, s2 whole numbers (row by row: a vector load of the 16 dd
         * stored one by one waited for those stores) */
        _Alignas(64) int32_t s1[16], s2[16];
        _mm512_store_si512((__m512i *)s1, _mm512_cvttps_epi32(red16_add(l1s)));
        if (levels == 2) _mm512_store_si512((__m512i *)s2, _mm512_cvttps_epi32(red16_add(l2s)));
        for (int m = 0; m < 16; m++) {
            if (levels == 2) {
                d[m] = dd[m] * (1.0f / 256.0f);
                s[m] = d[m] * (float)(256 * s1[m] + s2[m]);
            } else {
                d[m] = dd[m];
                s[m] = dd[m] * (float)s1[m];
            }
        }
    }
}

/* ---------------------------------------------------------------- the product */

/* Blocks per phase: a phase runs CHUNK blocks' tile products, then their float work, so that
 * the tile stores are done with by the time the vector loads read them. */
#define CHUNK QW_AMX_CHUNK

/* The work area: CHUNK unpacked blocks, each tile B (512 bytes of int8 codes, or 1 KiB of bf16),
 * then S, Sb (Q6_K's second group) and the min factors M of the 16 weight rows (16 floats each);
 * then the min sums of the call's act blocks (16 x 16 floats each). */
#define WORK_BLOCK QW_AMX_WORK_BLOCK
#define WORK_B 0
#define WORK_S 1024
#define WORK_SB 1088
#define WORK_M 1152

/* Blocks b0 .. b0 + n - 1 of the two groups unpacked into the work area (tile B as int8 codes, or
 * as bf16 with BF, through the code table lo, hi), once for every act block of the call (one unpacking per 16 act rows made it a
 * third of the product's time). */
R8_TARGET INLINE void unpack_groups(const int T, const int BF, const uint8_t *g0, const uint8_t *g1, int64_t b0,
                                    int n, __m512i lo, __m512i hi, uint8_t *work) {
    const int subs = IS_K(T) ? 8 : 1;
    const int rb = record_bytes(T);
    for (int k = 0; k < n; k++) {
        const int64_t b = b0 + k, i = b / subs;
        const int j = (int)(b % subs);
        const uint8_t *rec[2] = {g0 + (size_t)i * (size_t)rb, g1 ? g1 + (size_t)i * (size_t)rb : NULL};
        uint8_t *w = work + (size_t)k * WORK_BLOCK;
        __m256 S[2], Sb[2], M[2];
        __m256i c[2][8];
        for (int h = 0; h < 2; h++) {
            S[h] = Sb[h] = M[h] = _mm256_setzero_ps();
            if (!rec[h]) {
                for (int t = 0; t < 8; t++) c[h][t] = _mm256_setzero_si256();
            } else {
                __m256 Dmin;
                const __m256 D = record_scales(T, rec[h], &M[h], &Dmin);
                qw_prefetch_share(rec[h], rb, subs, j);
                unpack_sub(T, rec[h], j, D, Dmin, c[h], &S[h], &Sb[h], &M[h]);
                if (!BF) take_offset(T, c[h]);
            }
            if (!BF) put_steps(w + WORK_B, c[h], h);
        }
        if (BF) put_pairs(w + WORK_B, c[0], c[1], lo, hi);
        _mm512_store_ps((float *)(w + WORK_S), join_ps(S[0], S[1]));
        _mm512_store_ps((float *)(w + WORK_SB), join_ps(Sb[0], Sb[1]));
        _mm512_store_ps((float *)(w + WORK_M), join_ps(M[0], M[1]));
    }
}

/* The bf16 form of block_tiles: one float C tile per block (per 16-value group for Q6_K), level 1
 * then level 2 added into it, stored to Cb (1 KiB each). */
R8_TARGET INLINE void block_tiles_bf16(const int T, const uint8_t *B, const uint8_t *x, float *Cb) {
    if (T == QW_Q6_K) {
        TILE_LOAD(4, B, 64);
        TILE_LOAD(5, B + 512, 64);
        _tile_zero(0);
        _tile_zero(1);
        TILE_LOAD(2, x, 64);
        _tile_dpbf16ps(0, 2, 4);
        TILE_LOAD(3, x + 1024, 64);
        _tile_dpbf16ps(0, 3, 4);
        TILE_LOAD(2, x + 32, 64);
        _tile_dpbf16ps(1, 2, 5);
        TILE_LOAD(3, x + 1024 + 32, 64);
        _tile_dpbf16ps(1, 3, 5);
        TILE_STORE(0, Cb, 64);
        TILE_STORE(1, Cb + 256, 64);
        return;
    }
    TILE_LOAD(4, B, 64);
    _tile_zero(0);
    TILE_LOAD(2, x, 64);
    _tile_dpbf16ps(0, 2, 4);
    TILE_LOAD(3, x + 1024, 64);
    _tile_dpbf16ps(0, 3, 4);
    TILE_STORE(0, Cb, 64);
}

/* Act row m's block sum as a float: from the int32 C tiles (levels joined, then converted), or
 * as the bf16 C tile holds it. */
R8_TARGET INLINE __m512 block_value(const int BF, const int levels, const int32_t *c1, const int32_t *c2, int m) {
    if (BF) return _mm512_load_ps((const float *)c1 + 16 * m);
    return _mm512_cvtepi32_ps(joined(levels, c1, c2, m));
}

/* Blocks b0 .. b0 + n - 1 (unpacked in the work area) for the 16 act rows of AMX block xa: the
 * sums acc[m] (kept at out + 16 m between phases) and the min sums (at macc + 16 m). */
R8_TARGET INLINE void block_product(const int T, const int BITS, const int BF, const uint8_t *xa, int64_t b0, int n,
                                    const uint8_t *work, float *out, float *macc) {
    const int levels = BITS == 16 ? 2 : 1;
    const size_t ab = BF ? QW_AMX_ACT_BLOCK_BF16 : QW_AMX_ACT_BLOCK(BITS);
    const size_t scales = BF ? 2048 : 512 * (size_t)levels; /* offset of an act block's d */
    /* C per block (4-byte values): int32, level 1 then 2 (Q6_K: level 1's groups 0, 1, then level
     * 2's); bf16: one float tile (Q6_K: groups 0, 1) */
    const int cper = BF ? (T == QW_Q6_K ? 512 : 256) : (T == QW_Q6_K ? 1024 : 512);
    const int lvl2 = T == QW_Q6_K ? 512 : 256; /* offset of the int32 level 2 */
    _Alignas(64) int32_t Cb[CHUNK * 1024];
    for (int k = 0; k < n; k++) {
        const uint8_t *B = work + (size_t)k * WORK_BLOCK + WORK_B, *x = xa + (size_t)(b0 + k) * ab;
        if (BF)
            block_tiles_bf16(T, B, x, (float *)(Cb + k * cper));
        else
            block_tiles(T, levels, B, x, Cb + k * cper);
    }
    __m512 acc[16];
    for (int m = 0; m < 16; m++) acc[m] = _mm512_load_ps(out + 16 * m);
    for (int k = 0; k < n; k++) {
        const uint8_t *w = work + (size_t)k * WORK_BLOCK;
        const float *dx = (const float *)(xa + (size_t)(b0 + k) * ab + scales);
        const int32_t *cb = Cb + k * cper;
        const __m512 Sk = _mm512_load_ps((const float *)(w + WORK_S));
        /* Q6_K's second group: int32 level 1 at 256 (level 2 at 768); bf16 at 256 */
        for (int m = 0; m < 16; m++) {
            const __m512 d = _mm512_set1_ps(dx[m]);
            acc[m] = _mm512_fmadd_ps(block_value(BF, levels, cb, cb + lvl2, m), _mm512_mul_ps(Sk, d), acc[m]);
            if (T == QW_Q6_K)
                acc[m] = _mm512_fmadd_ps(block_value(BF, levels, cb + 256, cb + 768, m),
                                         _mm512_mul_ps(_mm512_load_ps((const float *)(w + WORK_SB)), d), acc[m]);
        }
    }
    for (int m = 0; m < 16; m++) _mm512_store_ps(out + 16 * m, acc[m]);
    if (HAS_MIN(T)) { /* macc = fma(M, s, macc) block by block, as in the other kernels */
        for (int m = 0; m < 16; m++) {
            __m512 v = _mm512_load_ps(macc + 16 * m);
            for (int k = 0; k < n; k++) {
                const float *sx = (const float *)(xa + (size_t)(b0 + k) * ab + scales) + 16;
                v = _mm512_fmadd_ps(_mm512_load_ps((const float *)(work + (size_t)k * WORK_BLOCK + WORK_M)),
                                    _mm512_set1_ps(sx[m]), v);
            }
            _mm512_store_ps(macc + 16 * m, v);
        }
    }
}

/* A phase of CHUNK blocks at a time, unpacked once for all n act blocks: the work area stays in
 * L1 whatever n is. (Unpacking the whole of K first made a batch of 16 rows slower: its work
 * area went out to L2 and back for one act block.) Writing each block's outputs to Y from here,
 * at Y's row stride, made the 1.5B's gate and up products 26% slower than writing them to out
 * and copying after. */
R8_TARGET INLINE void product_amx(const int T, const int BITS, const int BF, const uint8_t *g0, const uint8_t *g1,
                                  const uint8_t *xa, size_t astride, int64_t n, uint8_t *work, float *out,
                                  float *macc, int64_t b_lo, int64_t b_hi, int flags) {
    use_config((BF ? 2 : 0) + (T == QW_Q6_K ? 1 : 0));
    if (flags & QW_AMX_FIRST) {
        memset(out, 0, (size_t)n * 256 * sizeof(float));
        if (HAS_MIN(T)) memset(macc, 0, (size_t)n * 256 * sizeof(float));
    }
    __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
    if (BF) bf16_code_table(T, &lo, &hi);
    for (int64_t b0 = b_lo; b0 < b_hi; b0 += CHUNK) {
        const int nb = b_hi - b0 < CHUNK ? (int)(b_hi - b0) : CHUNK;
        unpack_groups(T, BF, g0, g1, b0, nb, lo, hi, work);
        for (int64_t j = 0; j < n; j++)
            block_product(T, BITS, BF, xa + (size_t)j * astride, b0, nb, work, out + 256 * j, macc + 256 * j);
    }
    if (HAS_MIN(T) && (flags & QW_AMX_LAST))
        for (int64_t i = 0; i < 16 * n; i++) {
            const __m512 a = _mm512_loadu_ps(out + 16 * i), mm = _mm512_loadu_ps(macc + 16 * i);
            _mm512_storeu_ps(out + 16 * i, T == QW_Q4_1 || T == QW_Q5_1 ? _mm512_add_ps(a, mm) : _mm512_sub_ps(a, mm));
        }
}

#define AMX(T, NAME, BITS)                                                                                      \
    R8_TARGET static void amx_##NAME##_##BITS(const uint8_t *g0, const uint8_t *g1, const uint8_t *xa,            \
                                              size_t astride, int64_t n, uint8_t *work, float *out, float *macc, \
                                              int64_t b0, int64_t b1, int flags) {                              \
        product_amx(T, BITS, 0, g0, g1, xa, astride, n, work, out, macc, b0, b1, flags);                        \
    }
#define AMXS(T, NAME) AMX(T, NAME, 8) AMX(T, NAME, 16)
R8_TYPES(AMXS)

/* The 16-bit kernels on bf16 tiles, for BF16_TYPES. */
#define AMXB(T, NAME)                                                                                           \
    R8_TARGET static void amxb_##NAME(const uint8_t *g0, const uint8_t *g1, const uint8_t *xa, size_t astride,     \
                                      int64_t n, uint8_t *work, float *out, float *macc, int64_t b0, int64_t b1, \
                                      int flags) {                                                              \
        product_amx(T, 16, 1, g0, g1, xa, astride, n, work, out, macc, b0, b1, flags);                          \
    }
BF16_TYPES(AMXB)

qw_amx_fn qw_amx_kernel_x86(int dtype, int bits) {
#define CASE(T, NAME) case T: return bits == 16 ? amx_##NAME##_16 : amx_##NAME##_8;
    switch (dtype) {
    R8_TYPES(CASE)
    default: return NULL;
    }
#undef CASE
}

qw_amx_fn qw_amx_kernel_bf16_x86(int dtype) {
#define CASE(T, NAME) case T: return amxb_##NAME;
    switch (dtype) {
    BF16_TYPES(CASE)
    default: return NULL;
    }
#undef CASE
}

#else
qw_amx_fn qw_amx_kernel_x86(int dtype, int bits) {
    (void)dtype;
    (void)bits;
    return NULL;
}

qw_amx_fn qw_amx_kernel_bf16_x86(int dtype) {
    (void)dtype;
    return NULL;
}

void qw_amx_release_x86(void) {}

void qw_amx_quantize_x86(const float *X, size_t ldx, int64_t n, int bits, int bf16, uint8_t *dst) {
    (void)X;
    (void)ldx;
    (void)n;
    (void)bits;
    (void)bf16;
    (void)dst;
}

#endif
