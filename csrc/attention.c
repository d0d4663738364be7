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

void qw_kv_write_row(const float *k, const float *v, int64_t t, int64_t n_kv_heads, int64_t hd, const int64_t *slots,
                     int64_t n_blocks, int64_t bs, int kv_type, void *Kc, void *Vc) {
    const int simd = qw_use_avx2();
    const int64_t blk = slots[t] / bs, off = slots[t] % bs;
    for (int64_t h = 0; h < n_kv_heads; h++) {
        const size_t head = (size_t)(h * n_blocks + blk) * (size_t)(bs * hd);
        store_row(v + (t * n_kv_heads + h) * hd, hd, kv_type, Vc, head + (size_t)(off * hd), simd);
        /* a key goes down a column of its block: dimension i at row i */
        const float *kt = k + (t * n_kv_heads + h) * hd;
        if (kv_type == QW_KV_F32) {
            for (int64_t i = 0; i < hd; i++) ((float *)Kc)[head + (size_t)(i * bs + off)] = kt[i];
            continue;
        }
        uint16_t row[256]; /* converted as a row (the same bits, on the SIMD path), then put down the column */
        for (int64_t i0 = 0; i0 < hd; i0 += 256) {
            const int64_t n = hd - i0 < 256 ? hd - i0 : 256;
            store_row(kt + i0, n, kv_type, row, 0, simd);
            for (int64_t i = 0; i < n; i++) ((uint16_t *)Kc)[head + (size_t)((i0 + i) * bs + off)] = row[i];
        }
    }
}

void qw_kv_write(const float *k, const float *v, int64_t T, int64_t n_kv_heads, int64_t hd,
                 const int64_t *slots, int64_t n_blocks, int64_t bs, int kv_type, void *Kc, void *Vc) {
    /* every row writes its own slots: a prompt's rows split over the threads */
#pragma omp parallel for num_threads(qw_get_threads()) schedule(static) if (T * n_kv_heads * hd >= 65536)
    for (int64_t t = 0; t < T; t++) qw_kv_write_row(k, v, t, n_kv_heads, hd, slots, n_blocks, bs, kv_type, Kc, Vc);
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
                               const int32_t *table, int64_t b0, int64_t b1, int64_t n, float scale, float *acc,
                               float *kbuf, float *vbuf, float *ml, float *out) {
    float m[64], l[64], s[MAX_BS];
    for (int64_t g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    memset(acc, 0, (size_t)(G * hd) * sizeof(float));
    for (int64_t b = b0; b < b1; b++) {
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
    if (ml) { /* a span's state, for merge_spans */
        for (int64_t g = 0; g < G; g++) {
            ml[g] = m[g];
            ml[G + g] = l[g];
        }
        memcpy(out, acc, (size_t)(G * hd) * sizeof(float));
        return;
    }
    for (int64_t g = 0; g < G; g++) {
        float inv = 1.0f / l[g];
        for (int64_t i = 0; i < hd; i++) out[g * hd + i] = acc[g * hd + i] * inv;
    }
}

/* ---------------------------------------------------------------- SIMD (hd a multiple of 8) */

#if QW_HAVE_X86
/* The block after next's keys and values, asked for a line of each at a time (see pf_some):
 * lines next .. lines - 1 of both are left. */
typedef struct {
    const char *k, *v;
    int64_t next, lines;
} pf_cursor;

#define ATT_TARGET QW_TARGET_AVX2
#define ATT(name) name##_avx2
#define ATT_MAX_GC 6
#define ATT_WIDE 0
#include "attention_x86.h"
#undef ATT_TARGET
#undef ATT
#undef ATT_MAX_GC
#undef ATT_WIDE

#define ATT_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")))
#define ATT(name) name##_avx512
#define ATT_MAX_GC 8
#define ATT_WIDE 1
#include "attention_x86.h"
#undef ATT_TARGET
#undef ATT
#undef ATT_MAX_GC
#undef ATT_WIDE
#endif

/* ---------------------------------------------------------------- spans
 *
 * A row's positions are attended in spans of SPAN_POSITIONS (whole blocks), each from a fresh
 * running max and sum, and the spans' states merged in order (merge_spans). A decode step at
 * long context has one row: as one work item per (row, kv head) it kept at most n_kv_heads
 * threads busy (2 for the Qwen2.5 models up to 3B), its spans are items of their own. Which
 * thread runs a span, and whether a row's spans run as separate items or one after another,
 * never changes the arithmetic, so a row's bits depend on its own positions only. A row within
 * one span is attended in one go, as it would be without spans. */
#define SPAN_POSITIONS 1024

/* Above this many bytes of span states the spans of every (row, kv head) run one after another
 * in their thread's scratch instead (many rows: their items alone keep the threads busy). */
#define SPLIT_STATE_BYTES ((size_t)32 << 20)

static int64_t span_blocks(int64_t bs) { return bs >= SPAN_POSITIONS ? 1 : SPAN_POSITIONS / bs; }

/* spans of sb blocks of bs positions over a row at position pos */
static int64_t row_spans(int64_t pos, int64_t bs, int64_t sb) { return (pos / bs + sb) / sb; }

/* out[G, hd] from S spans' states, each [m: G][l: G][acc: G * hd], merged in span order. */
static void merge_spans(const float *st, int64_t S, int64_t G, int64_t hd, float *out) {
    size_t each = (size_t)(G * hd + 2 * G);
    for (int64_t g = 0; g < G; g++) {
        float M = -INFINITY, L = 0.0f;
        for (int64_t c = 0; c < S; c++) M = st[c * each + g] > M ? st[c * each + g] : M;
        float *o = out + g * hd;
        memset(o, 0, (size_t)hd * sizeof(float));
        for (int64_t c = 0; c < S; c++) {
            const float *sp = st + c * each;
            float w = expf(sp[g] - M);
            L += sp[G + g] * w;
            const float *a = sp + 2 * G + g * hd;
            for (int64_t i = 0; i < hd; i++) o[i] += a[i] * w;
        }
        float inv = 1.0f / L;
        for (int64_t i = 0; i < hd; i++) o[i] *= inv;
    }
}

typedef struct {
    int64_t G, hd, bs, n_blocks, stride;
    int kv_type, simd, wide;
    float scale;
    const void *Kc, *Vc;
} att_args;

/* Blocks [b0, b1) of the row's n positions for kv head kvh's group: into out (finished) when
 * ml is NULL, else the span's state (ml, then acc into out). */
static void attend(const att_args *a, const float *q, int64_t kvh, const int32_t *table, int64_t b0, int64_t b1,
                   int64_t n, float *acc, float *sc, float *kbuf, float *vbuf, float *ml, float *out) {
    size_t esize = kv_esize(a->kv_type), off = (size_t)(kvh * a->n_blocks) * (size_t)a->stride * esize;
    head_pool Kp = {(const char *)a->Kc + off, a->kv_type, a->stride};
    head_pool Vp = {(const char *)a->Vc + off, a->kv_type, a->stride};
#if QW_HAVE_X86
    if (a->simd && a->wide)
        attend_group_avx512(q, a->G, a->hd, Kp, Vp, a->bs, table, b0, b1, n, a->scale, acc, sc, ml, out);
    else if (a->simd)
        attend_group_avx2(q, a->G, a->hd, Kp, Vp, a->bs, table, b0, b1, n, a->scale, acc, sc, ml, out);
    else
#endif
        attend_group_plain(q, a->G, a->hd, Kp, Vp, a->bs, table, b0, b1, n, a->scale, acc, kbuf, vbuf, ml, out);
    (void)sc;
}

int qw_paged_attention(const float *q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t hd,
                       int kv_type, const void *Kc, const void *Vc, int64_t n_blocks, int64_t bs,
                       const int32_t *block_tables,
                       int64_t max_blocks, const int32_t *row_seq, const int64_t *row_pos, float scale,
                       float *out) {
    int64_t G = n_heads / n_kv_heads;
    if (G > 64 || bs > MAX_BS || bs < 1 || (kv_type != QW_KV_F32 && kv_type != QW_KV_F16)) return -1;
    int simd = qw_use_avx2() && hd % 8 == 0;
    att_args A = {G, hd, bs, n_blocks, bs * hd, kv_type, simd, simd && qw_use_avx512(), scale, Kc, Vc};
    const int64_t sb = span_blocks(bs), Hkv = n_kv_heads;
    const size_t each = (size_t)(G * hd + 2 * G); /* floats of a span's state */
    /* row t's spans run over blocks [c sb, (c + 1) sb) */
    int64_t max_spans = 1, span_items = 0;
    for (int64_t t = 0; t < T; t++) {
        int64_t spans = row_spans(row_pos[t], bs, sb);
        max_spans = spans > max_spans ? spans : max_spans;
        span_items += Hkv * spans;
    }
    /* spans as items of their own where the rows' items are too few for the threads; then
     * first[t] is row t's first span item */
    int split = max_spans > 1 && T * Hkv < 4 * (int64_t)qw_get_threads() &&
                (size_t)span_items * each * sizeof(float) <= SPLIT_STATE_BYTES;
    int64_t *first = NULL;
    float *states = NULL;
    if (split) {
        first = malloc((size_t)(T + 1) * sizeof(int64_t));
        states = malloc((size_t)span_items * each * sizeof(float));
        if (!first || !states) {
            free(first);
            free(states);
            return -1;
        }
        first[0] = 0;
        for (int64_t t = 0; t < T; t++) first[t + 1] = first[t] + Hkv * row_spans(row_pos[t], bs, sb);
    }
    int64_t items = split ? span_items : T * Hkv;
    int failed = 0;
#pragma omp parallel num_threads(qw_get_threads())
    {
        /* acc [G, hd]; two blocks' scores [G, bs rounded up to 16] (the AVX-512 path scores two
         * blocks at once); for a 16-bit pool on the plain path, one block of one kv head's keys
         * and values as float32 (the AVX2 path widens in registers); the states of a (row, kv
         * head)'s spans when they run here one by one */
        size_t sstride = (size_t)(bs + 15) / 16 * 16;
        size_t own = !split && max_spans > 1 ? (size_t)max_spans * each : 0;
        size_t scratch = (size_t)(G * hd) + 2 * (size_t)G * sstride + (kv_type == QW_KV_F16 && !simd ? (size_t)(2 * bs * hd) : 0);
        float *acc = malloc((scratch + own) * sizeof(float));
        float *sc = acc ? acc + G * hd : NULL, *kbuf = sc ? sc + 2 * (size_t)G * sstride : NULL;
        float *vbuf = kbuf ? kbuf + bs * hd : NULL, *mine = acc ? acc + scratch : NULL;
        if (!acc) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            if (!acc) continue;
            int64_t t, kvh, c = 0;
            if (split) { /* the row whose items hold it */
                int64_t lo = 0, hi = T - 1;
                while (lo < hi) {
                    int64_t mid = (lo + hi + 1) / 2;
                    if (first[mid] <= it) lo = mid;
                    else hi = mid - 1;
                }
                t = lo;
            } else {
                t = it / Hkv;
            }
            int64_t n = row_pos[t] + 1, blocks = row_pos[t] / bs + 1, spans = row_spans(row_pos[t], bs, sb);
            if (split) {
                kvh = (it - first[t]) / spans;
                c = (it - first[t]) % spans;
            } else {
                kvh = it % Hkv;
            }
            const int32_t *table = block_tables + (size_t)row_seq[t] * max_blocks;
            const float *qg = q + (t * n_heads + kvh * G) * hd;
            float *og = out + (t * n_heads + kvh * G) * hd;
            if (spans == 1) {
                attend(&A, qg, kvh, table, 0, blocks, n, acc, sc, kbuf, vbuf, NULL, og);
            } else if (split) {
                float *st = states + (size_t)it * each;
                int64_t b1 = (c + 1) * sb < blocks ? (c + 1) * sb : blocks;
                attend(&A, qg, kvh, table, c * sb, b1, n, acc, sc, kbuf, vbuf, st, st + 2 * G);
            } else {
                for (c = 0; c < spans; c++) {
                    float *st = mine + (size_t)c * each;
                    int64_t b1 = (c + 1) * sb < blocks ? (c + 1) * sb : blocks;
                    attend(&A, qg, kvh, table, c * sb, b1, n, acc, sc, kbuf, vbuf, st, st + 2 * G);
                }
                merge_spans(mine, spans, G, hd, og);
            }
        }
        if (split) {
#pragma omp for schedule(dynamic, 1)
            for (int64_t p = 0; p < T * Hkv; p++) {
                int64_t t = p / Hkv, kvh = p % Hkv, spans = row_spans(row_pos[t], bs, sb);
                if (spans > 1 && !failed)
                    merge_spans(states + (size_t)(first[t] + kvh * spans) * each, spans, G, hd,
                                out + (t * n_heads + kvh * G) * hd);
            }
        }
        free(acc);
    }
    free(states);
    free(first);
    return failed ? -1 : 0;
}
