#include "attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "quant.h"
#include "vecmath.h"

#if QW_HAVE_X86
#include <immintrin.h>
#endif

/* Most key slots per block the kernels take (scores of a block live on the stack). */
#define MAX_BS 256

/* ---------------------------------------------------------------- 16-bit storage
 *
 * IEEE half precision, rounded to nearest even: quant.c's qw_f32_to_f16 and F16C's vcvtps2ph
 * give the same bits for every number (NaNs stay NaN), so a cache written by the plain path
 * reads the same on the AVX2 path and the other way round. Widening is quant.c's F16
 * dequantizer. */

#if QW_HAVE_X86
QW_TARGET_AVX2 static void store_f16_avx2(const float *src, int64_t n, uint16_t *dst) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) dst[i] = qw_f32_to_f16(src[i]);
}
#endif

static void store_row(const float *src, int64_t n, int kv_type, void *pool, size_t at, int simd) {
    if (kv_type == QW_KV_F32) {
        memcpy((float *)pool + at, src, (size_t)n * sizeof(float));
        return;
    }
    uint16_t *dst = (uint16_t *)pool + at;
#if QW_HAVE_X86
    if (simd) {
        store_f16_avx2(src, n, dst);
        return;
    }
#endif
    (void)simd;
    for (int64_t i = 0; i < n; i++) dst[i] = qw_f32_to_f16(src[i]);
}

void qw_kv_write(const float *k, const float *v, int64_t T, int64_t n_kv_heads, int64_t hd,
                 const int64_t *slots, int64_t n_blocks, int64_t bs, int kv_type, void *Kc, void *Vc) {
    int simd = qw_use_avx2();
    for (int64_t t = 0; t < T; t++) {
        int64_t blk = slots[t] / bs, off = slots[t] % bs;
        for (int64_t h = 0; h < n_kv_heads; h++) {
            size_t head = (size_t)(h * n_blocks + blk) * (size_t)(bs * hd);
            store_row(v + (t * n_kv_heads + h) * hd, hd, kv_type, Vc, head + (size_t)(off * hd), simd);
            /* a key goes down a column of its block: dimension i at row i */
            const float *kt = k + (t * n_kv_heads + h) * hd;
            for (int64_t i = 0; i < hd; i++) {
                size_t at = head + (size_t)(i * bs + off);
                if (kv_type == QW_KV_F32)
                    ((float *)Kc)[at] = kt[i];
                else
                    ((uint16_t *)Kc)[at] = qw_f32_to_f16(kt[i]);
            }
        }
    }
}

/* One kv head's keys or values in a block, as float32: the pool itself when it holds float32,
 * else n values converted into scratch (once per block, then read by every query head of the
 * group from L1). */
typedef struct {
    const void *base; /* this kv head's vectors in block 0 */
    int kv_type;
    int64_t stride;   /* values per block (all kv heads) */
} head_pool;

static size_t kv_esize(int kv_type) { return kv_type == QW_KV_F16 ? sizeof(uint16_t) : sizeof(float); }

/* The first value of one kv head's block in the pool. */
static const void *block_at(head_pool p, int32_t block) {
    return (const char *)p.base + (size_t)block * (size_t)p.stride * kv_esize(p.kv_type);
}

static const float *fetch(head_pool p, int32_t block, int64_t n, float *scratch) {
    if (p.kv_type == QW_KV_F32) return block_at(p, block);
    qw_dequant_row(QW_F16, block_at(p, block), scratch, n);
    return scratch;
}

/* ---------------------------------------------------------------- plain C
 *
 * One query row's G heads (one kv group) over n positions, block by block. Per head, m is the
 * largest score so far, l the sum of e^(s - m), acc the sum of e^(s - m) v; when a block raises
 * m, l and acc are first scaled by e^(m_old - m_new). */

/* q . k for a key stored down a column of its block (element i at k[i * stride]) */
static float dot_strided(const float *q, const float *k, int64_t stride, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += q[i] * k[i * stride];
    return s;
}

static void attend_group_plain(const float *q, int64_t G, int64_t hd, head_pool Kp, head_pool Vp, int64_t bs,
                               const int32_t *table, int64_t n, float scale, float *acc, float *kbuf,
                               float *vbuf, float *out) {
    float m[64], l[64], s[MAX_BS];
    for (int64_t g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    memset(acc, 0, (size_t)(G * hd) * sizeof(float));
    for (int64_t b = 0; b * bs < n; b++) {
        int64_t nk = n - b * bs < bs ? n - b * bs : bs;
        /* the keys' block is converted whole: its columns past nk lie between valid values */
        const float *Kb = fetch(Kp, table[b], bs * hd, kbuf), *Vb = fetch(Vp, table[b], nk * hd, vbuf);
        for (int64_t g = 0; g < G; g++) {
            const float *qg = q + g * hd;
            float *a = acc + g * hd;
            float bm = -INFINITY;
            for (int64_t j = 0; j < nk; j++) {
                s[j] = dot_strided(qg, Kb + j, bs, hd) * scale;
                bm = s[j] > bm ? s[j] : bm;
            }
            if (bm > m[g]) {
                float corr = m[g] == -INFINITY ? 0.0f : expf(m[g] - bm);
                l[g] *= corr;
                for (int64_t i = 0; i < hd; i++) a[i] *= corr;
                m[g] = bm;
            }
            for (int64_t j = 0; j < nk; j++) {
                float p = expf(s[j] - m[g]);
                l[g] += p;
                const float *vj = Vb + j * hd;
                for (int64_t i = 0; i < hd; i++) a[i] += p * vj[i];
            }
        }
    }
    for (int64_t g = 0; g < G; g++) {
        float inv = 1.0f / l[g];
        for (int64_t i = 0; i < hd; i++) out[g * hd + i] = acc[g * hd + i] * inv;
    }
}

/* ---------------------------------------------------------------- AVX2 (hd a multiple of 8) */

#if QW_HAVE_X86
QW_TARGET_AVX2 static float hsum8(__m256 v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* 8 consecutive values of a pool as float32: a float16 pool is widened in registers (exactly),
 * so its blocks are read once, straight from the pool, with no converted copy in between. */
QW_TARGET_AVX2 static inline __attribute__((always_inline)) __m256 load8(const void *base, int64_t i, int f16) {
    if (f16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)));
    return _mm256_loadu_ps((const float *)base + i);
}

/* Scores of gc query heads (gc <= 6) against 16 keys of a block stored transposed (dimension
 * i of key j at kt[i * bs + j]): each step down the block loads the 16 keys' i-th values once
 * (two vectors) and adds q[g][i] times them to every head's two accumulators, so the keys are
 * read once for the whole group and no horizontal sums are needed. `masked` tiles (the block's
 * last keys) read only their `valid` keys (masked loads of a float32 pool; a float16 pool's
 * are copied into zeroed lanes first, as a full load could run past the pool's end); the other
 * tiles read 16 full lanes. Always inlined with constant gc, masked and f16, so the accumulators
 * live in registers. kt: the block's first key value; j0: the tile's first key. */
QW_TARGET_AVX2 static inline __attribute__((always_inline)) void
tile_scores(const float *q, int gc, int64_t hd, const void *kt, int64_t j0, int64_t bs, int masked, int f16,
            int64_t valid, __m256i mlo, __m256i mhi, float scale, float *out, int64_t ostride) {
    __m256 acc[12];
    /* unrolled: a loop left rolled keeps acc in memory, a store per FMA */
#pragma GCC unroll 12
    for (int g = 0; g < 2 * gc; g++) acc[g] = _mm256_setzero_ps();
    for (int64_t i = 0; i < hd; i++) {
        int64_t at = i * bs + j0;
        __m256 lo, hi;
        if (masked && !f16) {
            lo = _mm256_maskload_ps((const float *)kt + at, mlo);
            hi = _mm256_maskload_ps((const float *)kt + at + 8, mhi);
        } else if (masked) {
            uint16_t part[16] = {0};
            memcpy(part, (const uint16_t *)kt + at, (size_t)valid * sizeof(uint16_t));
            lo = load8(part, 0, 1);
            hi = load8(part, 8, 1);
        } else {
            lo = load8(kt, at, f16);
            hi = load8(kt, at + 8, f16);
        }
#pragma GCC unroll 6
        for (int g = 0; g < gc; g++) {
            __m256 qb = _mm256_broadcast_ss(q + g * hd + i);
            acc[2 * g] = _mm256_fmadd_ps(qb, lo, acc[2 * g]);
            acc[2 * g + 1] = _mm256_fmadd_ps(qb, hi, acc[2 * g + 1]);
        }
    }
    __m256 vs = _mm256_set1_ps(scale);
#pragma GCC unroll 6
    for (int g = 0; g < gc; g++) {
        _mm256_storeu_ps(out + g * ostride, _mm256_mul_ps(acc[2 * g], vs));
        _mm256_storeu_ps(out + g * ostride + 8, _mm256_mul_ps(acc[2 * g + 1], vs));
    }
}

#define TILE_CASES(M, F)                                                                          \
    switch (gc) {                                                                                 \
    case 1: tile_scores(q, 1, hd, kt, j0, bs, M, F, valid, mlo, mhi, scale, out, ostride); break;        \
    case 2: tile_scores(q, 2, hd, kt, j0, bs, M, F, valid, mlo, mhi, scale, out, ostride); break;        \
    case 3: tile_scores(q, 3, hd, kt, j0, bs, M, F, valid, mlo, mhi, scale, out, ostride); break;        \
    case 4: tile_scores(q, 4, hd, kt, j0, bs, M, F, valid, mlo, mhi, scale, out, ostride); break;        \
    case 5: tile_scores(q, 5, hd, kt, j0, bs, M, F, valid, mlo, mhi, scale, out, ostride); break;        \
    default: tile_scores(q, 6, hd, kt, j0, bs, M, F, valid, mlo, mhi, scale, out, ostride); break;       \
    }

QW_TARGET_AVX2 static void tile_scores_any(const float *q, int gc, int64_t hd, const void *kt, int64_t j0, int64_t bs,
                                           int64_t valid, int f16, float scale, float *out, int64_t ostride) {
    __m256i mlo = _mm256_setzero_si256(), mhi = mlo;
    if (valid >= 16) {
        if (f16) {
            TILE_CASES(0, 1)
        } else {
            TILE_CASES(0, 0)
        }
        return;
    }
    __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    mlo = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)valid), idx);
    mhi = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)valid - 8), idx);
    if (f16) {
        TILE_CASES(1, 1)
    } else {
        TILE_CASES(1, 0)
    }
}
#undef TILE_CASES

/* One kv head's keys and values of the block after next, asked for ahead of use: a sequence's
 * blocks may lie anywhere in the pool, which the hardware prefetchers cannot know. The lines
 * are asked for a few before each tile of the current block: asked for all at once, at the
 * block's start, they filled the core's miss buffers and stalled the tiles' own loads (decode
 * attention over 4,096 positions of the 0.5B model took about 1.4x as long). */
typedef struct {
    const char *at[2];
    int64_t left[2]; /* bytes */
} pf_cursor;

QW_TARGET_AVX2 static inline void pf_some(pf_cursor *c, int lines) {
    for (int s = 0; s < 2 && lines > 0; s++)
        while (c->left[s] > 0 && lines > 0) {
            _mm_prefetch(c->at[s], _MM_HINT_T0);
            c->at[s] += 64;
            c->left[s] -= 64;
            lines--;
        }
}

/* Heads per chunk of the score and value tiles: at most 6, in even chunks (7 as 4 + 3, not
 * 6 + 1: a chunk of one head would leave two FMA chains, each waiting on its own latency). */
static int64_t heads_per_chunk(int64_t G) {
    int64_t chunks = (G + 5) / 6;
    return (G + chunks - 1) / chunks;
}

/* Scores of all G heads against a block's nk keys: sc[g * sstride + j], scaled. */
QW_TARGET_AVX2 static void block_scores_avx2(const float *q, int64_t G, int64_t hd, const void *Kt, int f16, int64_t bs,
                                             int64_t nk, float scale, float *sc, int64_t sstride, pf_cursor *pf, int pfn) {
    int64_t per = heads_per_chunk(G);
    for (int64_t j0 = 0; j0 < nk; j0 += 16)
        for (int64_t g0 = 0; g0 < G; g0 += per) {
            int gc = (int)(G - g0 < per ? G - g0 : per);
            pf_some(pf, pfn);
            tile_scores_any(q + g0 * hd, gc, hd, Kt, j0, bs, nk - j0, f16, scale, sc + g0 * sstride + j0, sstride);
        }
}

QW_TARGET_AVX2 static float max_avx2(const float *s, int64_t n) {
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + j));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float bm = _mm_cvtss_f32(m4);
    for (; j < n; j++) bm = s[j] > bm ? s[j] : bm;
    return bm;
}

/* a_g = corr_g * a_g + sum_j p_g[j] v_j for gc heads (gc <= 6) of a group, over W vectors (16 or
 * 8 columns) from column c: each value row is loaded (and widened) once for all the chunk's
 * heads, whose accumulators stay in registers over the block's nk values (the loops over them
 * are unrolled: left rolled, they kept r on the stack). Every output is the same product by
 * corr and the same FMA chain over j as one head at a time would give. */
QW_TARGET_AVX2 static inline __attribute__((always_inline)) void
pv_tile(float *acc, int gc, int W, int64_t hd, const float *corr, const float *p, int64_t pstride, const void *Vb,
        int f16, int64_t nk, int64_t c) {
    __m256 r[12];
#pragma GCC unroll 12
    for (int g = 0; g < gc * W; g++)
        r[g] = _mm256_mul_ps(_mm256_loadu_ps(acc + (g / W) * hd + c + 8 * (g % W)), _mm256_set1_ps(corr[g / W]));
    for (int64_t j = 0; j < nk; j++) {
        __m256 v0 = load8(Vb, j * hd + c, f16), v1 = W == 2 ? load8(Vb, j * hd + c + 8, f16) : v0;
#pragma GCC unroll 6
        for (int g = 0; g < gc; g++) {
            __m256 pj = _mm256_broadcast_ss(p + g * pstride + j);
            r[g * W] = _mm256_fmadd_ps(pj, v0, r[g * W]);
            if (W == 2) r[g * W + 1] = _mm256_fmadd_ps(pj, v1, r[g * W + 1]);
        }
    }
#pragma GCC unroll 12
    for (int g = 0; g < gc * W; g++) _mm256_storeu_ps(acc + (g / W) * hd + c + 8 * (g % W), r[g]);
}

#define PV_CASES(W, F)                                                                        \
    switch (gc) {                                                                             \
    case 1: pv_tile(acc, 1, W, hd, corr, p, pstride, Vb, F, nk, c); break;                    \
    case 2: pv_tile(acc, 2, W, hd, corr, p, pstride, Vb, F, nk, c); break;                    \
    case 3: pv_tile(acc, 3, W, hd, corr, p, pstride, Vb, F, nk, c); break;                    \
    case 4: pv_tile(acc, 4, W, hd, corr, p, pstride, Vb, F, nk, c); break;                    \
    case 5: pv_tile(acc, 5, W, hd, corr, p, pstride, Vb, F, nk, c); break;                    \
    default: pv_tile(acc, 6, W, hd, corr, p, pstride, Vb, F, nk, c); break;                   \
    }

QW_TARGET_AVX2 static void pv_tile_any(float *acc, int gc, int64_t hd, const float *corr, const float *p,
                                       int64_t pstride, const void *Vb, int f16, int64_t nk, int64_t c) {
    int wide = hd - c >= 16;
    if (wide && f16) {
        PV_CASES(2, 1)
    } else if (wide) {
        PV_CASES(2, 0)
    } else if (f16) {
        PV_CASES(1, 1)
    } else {
        PV_CASES(1, 0)
    }
}
#undef PV_CASES

/* The value update of all G heads over a block: heads in the score tiles' even chunks, columns
 * 16 at a time (8 for a last odd vector). */
QW_TARGET_AVX2 static void block_values_avx2(float *acc, int64_t G, int64_t hd, const float *corr, const float *p,
                                             int64_t pstride, const void *Vb, int f16, int64_t nk, pf_cursor *pf, int pfn) {
    int64_t per = heads_per_chunk(G);
    for (int64_t g0 = 0; g0 < G; g0 += per) {
        int gc = (int)(G - g0 < per ? G - g0 : per);
        for (int64_t c = 0; c < hd; c += hd - c >= 16 ? 16 : 8) {
            pf_some(pf, pfn);
            pv_tile_any(acc + g0 * hd, gc, hd, corr + g0, p + g0 * pstride, pstride, Vb, f16, nk, c);
        }
    }
}

QW_TARGET_AVX2 static void attend_group_avx2(const float *q, int64_t G, int64_t hd, head_pool Kp, head_pool Vp,
                                             int64_t bs, const int32_t *table, int64_t n, float scale, float *acc,
                                             float *sc, float *out) {
    float m[64], corr[64];
    __m256 l[64]; /* per head, the sum of e^(s - m) in 8 lanes: reduced once, at the end */
    const int f16 = Kp.kv_type == QW_KV_F16;
    int64_t sstride = (bs + 15) / 16 * 16; /* a head's scores: whole 16-key tiles, 8-lane exps */
    /* lines of a block's keys and values over the tiles of a full block (score tiles, then value
     * tiles), so that all are asked for before the block ends */
    int64_t chunks = (G + heads_per_chunk(G) - 1) / heads_per_chunk(G);
    int64_t tiles = chunks * ((bs + 15) / 16 + (hd + 15) / 16);
    int pf_lines = (int)((2 * bs * hd * (int64_t)kv_esize(Kp.kv_type) / 64 + tiles - 1) / tiles);
    for (int64_t g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = _mm256_setzero_ps();
    }
    memset(acc, 0, (size_t)(G * hd) * sizeof(float));
    for (int64_t b = 0; b * bs < n; b++) {
        int64_t nk = n - b * bs < bs ? n - b * bs : bs;
        pf_cursor pf = {{NULL, NULL}, {0, 0}};
        if ((b + 2) * bs < n) { /* the block after next: its lines arrive while this one is worked */
            pf.at[0] = block_at(Kp, table[b + 2]);
            pf.at[1] = block_at(Vp, table[b + 2]);
            pf.left[0] = pf.left[1] = bs * hd * (int64_t)kv_esize(Kp.kv_type);
        }
        const void *Kb = block_at(Kp, table[b]), *Vb = block_at(Vp, table[b]);
        block_scores_avx2(q, G, hd, Kb, f16, bs, nk, scale, sc, sstride, &pf, pf_lines);
        for (int64_t g = 0; g < G; g++) {
            float *s = sc + g * sstride;
            float bm = max_avx2(s, nk);
            corr[g] = 1.0f;
            if (bm > m[g]) {
                corr[g] = m[g] == -INFINITY ? 0.0f : expf(m[g] - bm);
                l[g] = _mm256_mul_ps(l[g], _mm256_set1_ps(corr[g]));
                m[g] = bm;
            }
            /* p = e^(s - m), 8 at a time; slots past nk are zeroed, not left at e^-87 */
            __m256 vm = _mm256_set1_ps(m[g]), lsum = _mm256_setzero_ps();
            for (int64_t j = 0; j < nk; j += 8) {
                __m256 e = qw_exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
                if (nk - j < 8) {
                    __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                    __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(nk - j)), idx);
                    e = _mm256_and_ps(e, _mm256_castsi256_ps(keep));
                }
                _mm256_storeu_ps(s + j, e);
                lsum = _mm256_add_ps(lsum, e);
            }
            l[g] = _mm256_add_ps(l[g], lsum);
        }
        block_values_avx2(acc, G, hd, corr, sc, sstride, Vb, f16, nk, &pf, pf_lines);
        pf_some(&pf, INT32_MAX);
    }
    for (int64_t g = 0; g < G; g++) {
        __m256 inv = _mm256_set1_ps(1.0f / hsum8(l[g]));
        for (int64_t i = 0; i < hd; i += 8)
            _mm256_storeu_ps(out + g * hd + i, _mm256_mul_ps(_mm256_loadu_ps(acc + g * hd + i), inv));
    }
}
#endif

int qw_paged_attention(const float *q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t hd,
                       int kv_type, const void *Kc, const void *Vc, int64_t n_blocks, int64_t bs,
                       const int32_t *block_tables,
                       int64_t max_blocks, const int32_t *row_seq, const int64_t *row_pos, float scale,
                       float *out) {
    int64_t G = n_heads / n_kv_heads;
    int64_t stride = bs * hd; /* values per block of one kv head */
    size_t esize = kv_esize(kv_type);
    if (G > 64 || bs > MAX_BS || bs < 1 || (kv_type != QW_KV_F32 && kv_type != QW_KV_F16)) return -1;
    int simd = qw_use_avx2() && hd % 8 == 0;
    int failed = 0;
#pragma omp parallel num_threads(qw_get_threads())
    {
        /* acc [G, hd]; a block's scores [G, bs rounded up to 16]; for a 16-bit pool on the plain
         * path, one block of one kv head's keys and values as float32 (the AVX2 path widens in
         * registers) */
        size_t sstride = (size_t)(bs + 15) / 16 * 16;
        size_t scratch = (size_t)(G * hd) + (size_t)G * sstride + (kv_type == QW_KV_F16 && !simd ? (size_t)(2 * bs * hd) : 0);
        float *acc = malloc(scratch * sizeof(float));
        float *sc = acc ? acc + G * hd : NULL, *kbuf = sc ? sc + (size_t)G * sstride : NULL;
        float *vbuf = kbuf ? kbuf + bs * hd : NULL;
        if (!acc) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int64_t t = 0; t < T; t++)
            for (int64_t kvh = 0; kvh < n_kv_heads; kvh++) {
                if (!acc) continue;
                const int32_t *table = block_tables + (size_t)row_seq[t] * max_blocks;
                const float *qg = q + (t * n_heads + kvh * G) * hd;
                float *og = out + (t * n_heads + kvh * G) * hd;
                head_pool Kp = {(const char *)Kc + (size_t)(kvh * n_blocks) * (size_t)stride * esize, kv_type, stride};
                head_pool Vp = {(const char *)Vc + (size_t)(kvh * n_blocks) * (size_t)stride * esize, kv_type, stride};
#if QW_HAVE_X86
                if (simd)
                    attend_group_avx2(qg, G, hd, Kp, Vp, bs, table, row_pos[t] + 1, scale, acc, sc, og);
                else
#endif
                    attend_group_plain(qg, G, hd, Kp, Vp, bs, table, row_pos[t] + 1, scale, acc, kbuf, vbuf, og);
            }
        free(acc);
    }
    return failed ? -1 : 0;
}
