/* The SIMD attention kernels (hd a multiple of 8), included by attention.c once per target:
 * AVX2 (16 vector registers: tiles of at most 6 heads x 16 keys in 256-bit vectors) and AVX-512
 * (ATT_WIDE: 32 registers, tiles of up to 8 heads, 16 keys or value columns per 512-bit FMA, so a
 * group of 7 or 8 query heads per kv head, as in Qwen2.5-0.5B and -7B, reads each block's keys and
 * values once instead of twice; two such tiles at once where they fit: two full blocks' scores,
 * 32 value columns). Before including it attention.c defines ATT_TARGET, ATT(name)
 * (the name with the target's suffix), ATT_MAX_GC and ATT_WIDE. Every score and every output is
 * the same FMA chain whatever the tile's head count or vector width, so both targets give the
 * same bits. */

/* A tile of 7 heads where the target has the registers for it, else the 6-head one (unused). */
#define ATT_GC(n) ((n) <= ATT_MAX_GC ? (n) : 6)

/* CALL(gc, ...) with the head count gc a constant, so a tile's loops over heads unroll (left
 * rolled they keep the accumulators in memory). */
#define GC_CASES(CALL, ...)                             \
    switch (gc) {                                       \
    case 1: CALL(1, __VA_ARGS__); break;                \
    case 2: CALL(2, __VA_ARGS__); break;                \
    case 3: CALL(3, __VA_ARGS__); break;                \
    case 4: CALL(4, __VA_ARGS__); break;                \
    case 5: CALL(5, __VA_ARGS__); break;                \
    case 6: CALL(6, __VA_ARGS__); break;                \
    case 7: CALL(ATT_GC(7), __VA_ARGS__); break;        \
    default: CALL(ATT_MAX_GC, __VA_ARGS__); break;      \
    }

ATT_TARGET static float ATT(hsum8)(__m256 v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* 8 consecutive values of a pool as float32: a float16 pool is widened in registers (exactly),
 * so its blocks are read once, straight from the pool, with no converted copy in between. */
ATT_TARGET static inline __attribute__((always_inline)) __m256 ATT(load8)(const void *base, int64_t i, int f16) {
    if (f16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)));
    return _mm256_loadu_ps((const float *)base + i);
}

#if ATT_WIDE
/* AVX-512: 16 keys (or value columns) per 512-bit vector, one FMA where AVX2 needs two; every
 * lane's chain is the same as on AVX2, so the bits are too. */
ATT_TARGET static inline __attribute__((always_inline)) __m512 ATT(load16)(const void *base, int64_t i, int f16) {
    if (f16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i)));
    return _mm512_loadu_ps((const float *)base + i);
}

/* tile_scores below on 512-bit vectors; a masked tile loads only its `valid` keys (the others
 * read as zeros, as the AVX2 tile's). */
ATT_TARGET static inline __attribute__((always_inline)) void
ATT(tile_scores16)(const float *q, int gc, int64_t hd, const void *kt, int64_t j0, int64_t bs, int masked, int f16,
                   int64_t valid, float scale, float *out, int64_t ostride) {
    const __mmask16 keep = masked ? (__mmask16)((1u << valid) - 1u) : (__mmask16)0xFFFF;
    __m512 acc[ATT_MAX_GC];
#pragma GCC unroll 8
    for (int g = 0; g < gc; g++) acc[g] = _mm512_setzero_ps();
    for (int64_t i = 0; i < hd; i++) {
        int64_t at = i * bs + j0;
        __m512 k;
        if (masked && f16)
            k = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(keep, (const uint16_t *)kt + at));
        else if (masked)
            k = _mm512_maskz_loadu_ps(keep, (const float *)kt + at);
        else
            k = ATT(load16)(kt, at, f16);
#pragma GCC unroll 8
        for (int g = 0; g < gc; g++) acc[g] = _mm512_fmadd_ps(_mm512_set1_ps(q[g * hd + i]), k, acc[g]);
    }
    __m512 vs = _mm512_set1_ps(scale);
#pragma GCC unroll 8
    for (int g = 0; g < gc; g++) _mm512_storeu_ps(out + g * ostride, _mm512_mul_ps(acc[g], vs));
}

/* pv_tile below over 16 columns in one 512-bit vector per head. */
ATT_TARGET static inline __attribute__((always_inline)) void
ATT(pv_tile16)(float *acc, int gc, int64_t hd, const float *corr, const float *p, int64_t pstride, const void *Vb,
               int f16, int64_t nk, int64_t c) {
    __m512 r[ATT_MAX_GC];
#pragma GCC unroll 8
    for (int g = 0; g < gc; g++) r[g] = _mm512_mul_ps(_mm512_loadu_ps(acc + g * hd + c), _mm512_set1_ps(corr[g]));
    for (int64_t j = 0; j < nk; j++) {
        __m512 v = ATT(load16)(Vb, j * hd + c, f16);
#pragma GCC unroll 8
        for (int g = 0; g < gc; g++) r[g] = _mm512_fmadd_ps(_mm512_set1_ps(p[g * pstride + j]), v, r[g]);
    }
#pragma GCC unroll 8
    for (int g = 0; g < gc; g++) _mm512_storeu_ps(acc + g * hd + c, r[g]);
}

/* Two of the tiles above at once (keys j0 .. j0 + 15 of two blocks, or 32 value columns): each
 * broadcast query value or probability then feeds two FMAs instead of one. With one FMA per
 * broadcast load the 16-wide tiles were bound by the loads; every lane's chain is the same, so
 * the bits are too. The scores: the block at kt0's into out0, the block at kt1's into out1. */
ATT_TARGET static inline __attribute__((always_inline)) void
ATT(tile_scores32)(const float *q, int gc, int64_t hd, const void *kt0, const void *kt1, int64_t j0, int64_t bs,
                   int f16, float scale, float *out0, float *out1, int64_t ostride) {
    __m512 a0[ATT_MAX_GC], a1[ATT_MAX_GC];
#pragma GCC unroll 8
    for (int g = 0; g < gc; g++) a0[g] = a1[g] = _mm512_setzero_ps();
    for (int64_t i = 0; i < hd; i++) {
        const __m512 k0 = ATT(load16)(kt0, i * bs + j0, f16), k1 = ATT(load16)(kt1, i * bs + j0, f16);
#pragma GCC unroll 8
        for (int g = 0; g < gc; g++) {
            const __m512 qb = _mm512_set1_ps(q[g * hd + i]);
            a0[g] = _mm512_fmadd_ps(qb, k0, a0[g]);
            a1[g] = _mm512_fmadd_ps(qb, k1, a1[g]);
        }
    }
    const __m512 vs = _mm512_set1_ps(scale);
#pragma GCC unroll 8
    for (int g = 0; g < gc; g++) {
        _mm512_storeu_ps(out0 + g * ostride, _mm512_mul_ps(a0[g], vs));
        _mm512_storeu_ps(out1 + g * ostride, _mm512_mul_ps(a1[g], vs));
    }
}

ATT_TARGET static inline __attribute__((always_inline)) void
ATT(pv_tile32)(float *acc, int gc, int64_t hd, const float *corr, const float *p, int64_t pstride, const void *Vb,
               int f16, int64_t nk, int64_t c) {
    __m512 r0[ATT_MAX_GC], r1[ATT_MAX_GC];
#pragma GCC unroll 8
    for (int g = 0; g < gc; g++) {
        const __m512 cg = _mm512_set1_ps(corr[g]);
        r0[g] = _mm512_mul_ps(_mm512_loadu_ps(acc + g * hd + c), cg);
        r1[g] = _mm512_mul_ps(_mm512_loadu_ps(acc + g * hd + c + 16), cg);
    }
    for (int64_t j = 0; j < nk; j++) {
        const __m512 v0 = ATT(load16)(Vb, j * hd + c, f16), v1 = ATT(load16)(Vb, j * hd + c + 16, f16);
#pragma GCC unroll 8
        for (int g = 0; g < gc; g++) {
            const __m512 pj = _mm512_set1_ps(p[g * pstride + j]);
            r0[g] = _mm512_fmadd_ps(pj, v0, r0[g]);
            r1[g] = _mm512_fmadd_ps(pj, v1, r1[g]);
        }
    }
#pragma GCC unroll 8
    for (int g = 0; g < gc; g++) {
        _mm512_storeu_ps(acc + g * hd + c, r0[g]);
        _mm512_storeu_ps(acc + g * hd + c + 16, r1[g]);
    }
}

ATT_TARGET static void ATT(tile_scores32_any)(const float *q, int gc, int64_t hd, const void *kt0, const void *kt1,
                                             int64_t j0, int64_t bs, int f16, float scale, float *out0, float *out1,
                                             int64_t ostride) {
#define S32(n, F) ATT(tile_scores32)(q, n, hd, kt0, kt1, j0, bs, F, scale, out0, out1, ostride)
    if (f16)
        GC_CASES(S32, 1)
    else
        GC_CASES(S32, 0)
#undef S32
}

ATT_TARGET static void ATT(pv_tile32_any)(float *acc, int gc, int64_t hd, const float *corr, const float *p,
                                         int64_t pstride, const void *Vb, int f16, int64_t nk, int64_t c) {
#define P32(n, F) ATT(pv_tile32)(acc, n, hd, corr, p, pstride, Vb, F, nk, c)
    if (f16)
        GC_CASES(P32, 1)
    else
        GC_CASES(P32, 0)
#undef P32
}
#endif

/* Scores of gc query heads (gc <= ATT_MAX_GC) against 16 keys of a block stored transposed (dimension
 * i of key j at kt[i * bs + j]): each step down the block loads the 16 keys' i-th values once
 * (two vectors) and adds q[g][i] times them to every head's two accumulators, so the keys are
 * read once for the whole group and no horizontal sums are needed. `masked` tiles (the block's
 * last keys) read only their `valid` keys (masked loads of a float32 pool; a float16 pool's
 * are copied into zeroed lanes first, as a full load could run past the pool's end); the other
 * tiles read 16 full lanes. Always inlined with constant gc, masked and f16, so the accumulators
 * live in registers. kt: the block's first key value; j0: the tile's first key. */
ATT_TARGET static inline __attribute__((always_inline)) void
ATT(tile_scores)(const float *q, int gc, int64_t hd, const void *kt, int64_t j0, int64_t bs, int masked, int f16,
            int64_t valid, __m256i mlo, __m256i mhi, float scale, float *out, int64_t ostride) {
#if ATT_WIDE
    (void)mlo;
    (void)mhi;
    ATT(tile_scores16)(q, gc, hd, kt, j0, bs, masked, f16, valid, scale, out, ostride);
#else
    __m256 acc[2 * ATT_MAX_GC];
    /* unrolled: a loop left rolled keeps acc in memory, a store per FMA */
#pragma GCC unroll 16
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
            lo = ATT(load8)(part, 0, 1);
            hi = ATT(load8)(part, 8, 1);
        } else {
            lo = ATT(load8)(kt, at, f16);
            hi = ATT(load8)(kt, at + 8, f16);
        }
#pragma GCC unroll 8
        for (int g = 0; g < gc; g++) {
            __m256 qb = _mm256_broadcast_ss(q + g * hd + i);
            acc[2 * g] = _mm256_fmadd_ps(qb, lo, acc[2 * g]);
            acc[2 * g + 1] = _mm256_fmadd_ps(qb, hi, acc[2 * g + 1]);
        }
    }
    __m256 vs = _mm256_set1_ps(scale);
#pragma GCC unroll 8
    for (int g = 0; g < gc; g++) {
        _mm256_storeu_ps(out + g * ostride, _mm256_mul_ps(acc[2 * g], vs));
        _mm256_storeu_ps(out + g * ostride + 8, _mm256_mul_ps(acc[2 * g + 1], vs));
    }
#endif
}

ATT_TARGET static void ATT(tile_scores_any)(const float *q, int gc, int64_t hd, const void *kt, int64_t j0, int64_t bs,
                                           int64_t valid, int f16, float scale, float *out, int64_t ostride) {
    __m256i mlo = _mm256_setzero_si256(), mhi = mlo;
#define TILE(n, M, F) ATT(tile_scores)(q, n, hd, kt, j0, bs, M, F, valid, mlo, mhi, scale, out, ostride)
    if (valid >= 16) {
        if (f16) {
            GC_CASES(TILE, 0, 1)
        } else {
            GC_CASES(TILE, 0, 0)
        }
        return;
    }
    __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    mlo = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)valid), idx);
    mhi = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)valid - 8), idx);
    if (f16) {
        GC_CASES(TILE, 1, 1)
    } else {
        GC_CASES(TILE, 1, 0)
    }
}
#undef TILE

/* One kv head's keys and values of the block after next, asked for ahead of use: a sequence's
 * blocks may lie anywhere in the pool, which the hardware prefetchers cannot know. The lines
 * are asked for a few before each tile of the current block: asked for all at once, at the
 * block's start, they filled the core's miss buffers and stalled the tiles' own loads (decode
 * attention over 4,096 positions of the 0.5B model took about 1.4x as long). They are asked
 * into L2, not L1: the L1's few miss buffers held a core to under half of the memory's
 * bandwidth (Zen 4, the 1.5B's shapes at 4,096 positions from memory: 245 -> 201 us per layer;
 * no change with the cache warm, or on the 0.5B, whose attention is bound by its FMAs). A line
 * of the keys and the same line of the values go together, from one index kept in a register:
 * a cursor over the keys, then the values, stored its address and count back at every line,
 * and that bookkeeping was about a quarter of attend_group's own time (decode at 4,096
 * positions, cache warm). Spreading the lines over the tiles' inner steps instead of a few
 * before each tile was slower, warm and cold. */
ATT_TARGET static inline void ATT(pf_some)(pf_cursor *c, int pairs) {
    const int64_t end = c->lines - c->next < pairs ? c->lines : c->next + pairs;
    for (int64_t i = c->next; i < end; i++) {
        _mm_prefetch(c->k + 64 * i, _MM_HINT_T1);
        _mm_prefetch(c->v + 64 * i, _MM_HINT_T1);
    }
    c->next = end;
}

/* Heads per chunk of the score and value tiles: at most ATT_MAX_GC, in even chunks (7 on AVX2
 * as 4 + 3, not 6 + 1: a chunk of one head would leave two FMA chains, each waiting on its own
 * latency). */
static int64_t ATT(heads_per_chunk)(int64_t G) {
    int64_t chunks = (G + ATT_MAX_GC - 1) / ATT_MAX_GC;
    return (G + chunks - 1) / chunks;
}

/* Scores of all G heads against a block's nk keys: sc[g * sstride + j], scaled. */
ATT_TARGET static void ATT(block_scores)(const float *q, int64_t G, int64_t hd, const void *Kt, int f16, int64_t bs,
                                             int64_t nk, float scale, float *sc, int64_t sstride, pf_cursor *pf, int pfn) {
    int64_t per = ATT(heads_per_chunk)(G);
    for (int64_t j0 = 0; j0 < nk; j0 += 16)
        for (int64_t g0 = 0; g0 < G; g0 += per) {
            int gc = (int)(G - g0 < per ? G - g0 : per);
            ATT(pf_some)(pf, pfn);
            ATT(tile_scores_any)(q + g0 * hd, gc, hd, Kt, j0, bs, nk - j0, f16, scale, sc + g0 * sstride + j0, sstride);
        }
}

#if ATT_WIDE
/* The scores of two full blocks (bs keys each, bs a multiple of 16) in one pass, into sc and sc2:
 * a block of 16 keys has only one 16-key tile, so the tiles are paired across blocks. The
 * scores do not depend on the softmax state, so computing the next block's early changes no
 * bit. */
ATT_TARGET static void ATT(block_scores2)(const float *q, int64_t G, int64_t hd, const void *Kt, const void *Kt2, int f16,
                                          int64_t bs, float scale, float *sc, float *sc2, int64_t sstride, pf_cursor *pf,
                                          int pfn) {
    int64_t per = ATT(heads_per_chunk)(G);
    for (int64_t j0 = 0; j0 < bs; j0 += 16)
        for (int64_t g0 = 0; g0 < G; g0 += per) {
            int gc = (int)(G - g0 < per ? G - g0 : per);
            ATT(pf_some)(pf, 2 * pfn);
            ATT(tile_scores32_any)(q + g0 * hd, gc, hd, Kt, Kt2, j0, bs, f16, scale, sc + g0 * sstride + j0,
                                   sc2 + g0 * sstride + j0, sstride);
        }
}
#endif

ATT_TARGET static float ATT(max)(const float *s, int64_t n) {
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

/* a_g = corr_g * a_g + sum_j p_g[j] v_j for gc heads (gc <= ATT_MAX_GC) of a group, over W vectors (16 or
 * 8 columns) from column c: each value row is loaded (and widened) once for all the chunk's
 * heads, whose accumulators stay in registers over the block's nk values (the loops over them
 * are unrolled: left rolled, they kept r on the stack). Every output is the same product by
 * corr and the same FMA chain over j as one head at a time would give. */
ATT_TARGET static inline __attribute__((always_inline)) void
ATT(pv_tile)(float *acc, int gc, int W, int64_t hd, const float *corr, const float *p, int64_t pstride, const void *Vb,
        int f16, int64_t nk, int64_t c) {
#if ATT_WIDE
    if (W == 2) {
        ATT(pv_tile16)(acc, gc, hd, corr, p, pstride, Vb, f16, nk, c);
        return;
    }
#endif
    __m256 r[2 * ATT_MAX_GC];
#pragma GCC unroll 16
    for (int g = 0; g < gc * W; g++)
        r[g] = _mm256_mul_ps(_mm256_loadu_ps(acc + (g / W) * hd + c + 8 * (g % W)), _mm256_set1_ps(corr[g / W]));
    for (int64_t j = 0; j < nk; j++) {
        __m256 v0 = ATT(load8)(Vb, j * hd + c, f16), v1 = W == 2 ? ATT(load8)(Vb, j * hd + c + 8, f16) : v0;
#pragma GCC unroll 8
        for (int g = 0; g < gc; g++) {
            __m256 pj = _mm256_broadcast_ss(p + g * pstride + j);
            r[g * W] = _mm256_fmadd_ps(pj, v0, r[g * W]);
            if (W == 2) r[g * W + 1] = _mm256_fmadd_ps(pj, v1, r[g * W + 1]);
        }
    }
#pragma GCC unroll 16
    for (int g = 0; g < gc * W; g++) _mm256_storeu_ps(acc + (g / W) * hd + c + 8 * (g % W), r[g]);
}

ATT_TARGET static void ATT(pv_tile_any)(float *acc, int gc, int64_t hd, const float *corr, const float *p,
                                       int64_t pstride, const void *Vb, int f16, int64_t nk, int64_t c) {
    int wide = hd - c >= 16;
#define PV(n, W, F) ATT(pv_tile)(acc, n, W, hd, corr, p, pstride, Vb, F, nk, c)
    if (wide && f16) {
        GC_CASES(PV, 2, 1)
    } else if (wide) {
        GC_CASES(PV, 2, 0)
    } else if (f16) {
        GC_CASES(PV, 1, 1)
    } else {
        GC_CASES(PV, 1, 0)
    }
}
#undef PV

/* The value update of all G heads over a block: heads in the score tiles' even chunks, columns
 * 16 at a time (8 for a last odd vector). */
ATT_TARGET static void ATT(block_values)(float *acc, int64_t G, int64_t hd, const float *corr, const float *p,
                                             int64_t pstride, const void *Vb, int f16, int64_t nk, pf_cursor *pf, int pfn) {
    int64_t per = ATT(heads_per_chunk)(G);
    for (int64_t g0 = 0; g0 < G; g0 += per) {
        int gc = (int)(G - g0 < per ? G - g0 : per);
        for (int64_t c = 0; c < hd;) {
            const int64_t w = ATT_WIDE && hd - c >= 32 ? 32 : hd - c >= 16 ? 16 : 8;
            ATT(pf_some)(pf, w == 32 ? 2 * pfn : pfn);
#if ATT_WIDE
            if (w == 32)
                ATT(pv_tile32_any)(acc + g0 * hd, gc, hd, corr + g0, p + g0 * pstride, pstride, Vb, f16, nk, c);
            else
#endif
                ATT(pv_tile_any)(acc + g0 * hd, gc, hd, corr + g0, p + g0 * pstride, pstride, Vb, f16, nk, c);
            c += w;
        }
    }
}

ATT_TARGET static void ATT(attend_group)(const float *q, int64_t G, int64_t hd, head_pool Kp, head_pool Vp,
                                             int64_t bs, const int32_t *table, int64_t b0, int64_t b1, int64_t n,
                                             float scale, float *acc, float *sc, float *ml, float *out) {
    float m[64], corr[64];
    __m256 l[64]; /* per head, the sum of e^(s - m) in 8 lanes: reduced once, at the end */
    const int f16 = Kp.kv_type == QW_KV_F16;
    int64_t sstride = (bs + 15) / 16 * 16; /* a head's scores: whole 16-key tiles, 8-lane exps */
    /* lines of a block's keys and values over the tiles of a full block (score tiles, then value
     * tiles), so that all are asked for before the block ends */
    int64_t chunks = (G + ATT(heads_per_chunk)(G) - 1) / ATT(heads_per_chunk)(G);
    int64_t tiles = chunks * ((bs + 15) / 16 + (hd + 15) / 16);
    const int64_t block_lines = (bs * hd * (int64_t)kv_esize(Kp.kv_type) + 63) / 64;
    int pf_lines = (int)((block_lines + tiles - 1) / tiles); /* of the keys and of the values each */
    for (int64_t g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = _mm256_setzero_ps();
    }
    memset(acc, 0, (size_t)(G * hd) * sizeof(float));
    /* sc: this block's scores; its second half, the next block's when they were paired */
    float *cur = sc, *nxt = sc + G * sstride;
    int ready = 0;
    for (int64_t b = b0; b < b1; b++) {
        int64_t nk = n - b * bs < bs ? n - b * bs : bs;
        pf_cursor pf = {NULL, NULL, 0, 0};
        /* the block after next, also past the span (the next span's, often run next by this
         * thread): its lines arrive while this one is worked */
        if ((b + 2) * bs < n) {
            pf.k = block_at(Kp, table[b + 2]);
            pf.v = block_at(Vp, table[b + 2]);
            pf.lines = block_lines;
        }
        const void *Kb = block_at(Kp, table[b]), *Vb = block_at(Vp, table[b]);
        if (ready) { /* computed with the block before */
            float *t = cur;
            cur = nxt;
            nxt = t;
            ready = 0;
        }
#if ATT_WIDE
        else if (bs % 16 == 0 && b + 1 < b1 && n - (b + 1) * bs >= bs) { /* this block and the next full */
            ATT(block_scores2)(q, G, hd, Kb, block_at(Kp, table[b + 1]), f16, bs, scale, cur, nxt, sstride, &pf, pf_lines);
            ready = 1;
        }
#endif
        else
            ATT(block_scores)(q, G, hd, Kb, f16, bs, nk, scale, cur, sstride, &pf, pf_lines);
        for (int64_t g = 0; g < G; g++) {
            float *s = cur + g * sstride;
            float bm = ATT(max)(s, nk);
            corr[g] = 1.0f;
            if (bm > m[g]) {
                corr[g] = m[g] == -INFINITY ? 0.0f : expf(m[g] - bm);
                l[g] = _mm256_mul_ps(l[g], _mm256_set1_ps(corr[g]));
                m[g] = bm;
            }
            /* p = e^(s - m), 8 at a time; slots past nk are zeroed, not left at e^-87 */
            __m256 vm = _mm256_set1_ps(m[g]), lsum = _mm256_setzero_ps();
            int64_t j0 = 0;
#if ATT_WIDE
            /* 16 at a time (qw_exp8's bits), each half added to the 8 lanes in turn as the 8-lane
             * loop adds them; the slots to the next 16 past nk are zeroed (the scores' rows are
             * whole 16-key tiles) */
            const __m512 vm16 = _mm512_set1_ps(m[g]);
            for (; j0 < nk; j0 += 16) {
                __m512 e = qw_exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j0), vm16));
                if (nk - j0 < 16) e = _mm512_maskz_mov_ps((__mmask16)((1u << (nk - j0)) - 1), e);
                _mm512_storeu_ps(s + j0, e);
                lsum = _mm256_add_ps(lsum, _mm512_castps512_ps256(e));
                lsum = _mm256_add_ps(lsum, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
            }
#endif
            for (int64_t j = j0; j < nk; j += 8) {
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
        ATT(block_values)(acc, G, hd, corr, cur, sstride, Vb, f16, nk, &pf, pf_lines);
        ATT(pf_some)(&pf, INT32_MAX);
    }
    if (ml) { /* a span's state, for merge_spans */
        for (int64_t g = 0; g < G; g++) {
            ml[g] = m[g];
            ml[G + g] = ATT(hsum8)(l[g]);
        }
        memcpy(out, acc, (size_t)(G * hd) * sizeof(float));
        return;
    }
    for (int64_t g = 0; g < G; g++) {
        __m256 inv = _mm256_set1_ps(1.0f / ATT(hsum8)(l[g]));
        for (int64_t i = 0; i < hd; i += 8)
            _mm256_storeu_ps(out + g * hd + i, _mm256_mul_ps(_mm256_loadu_ps(acc + g * hd + i), inv));
    }
}

#undef GC_CASES
#undef ATT_GC
