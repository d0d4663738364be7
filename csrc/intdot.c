/* The integer path's weights: row-interleaved ("R8") layouts, repacking, and the plain-C
 * products in quant.h's one order (intdot_avx2.c has the AVX2 ones).
 *
 * R8 layouts. A group of 8 rows (rows 8g .. 8g + 7 of the matrix) is stored as its blocks in
 * order, one record per block index holding that block of all 8 rows. Within a 32-value block,
 * value v of row r is at "step" s = v / 4, "position" p = 4 r + v % 4: the 32 positions of a
 * step are one 32-byte vector, 4 consecutive values of each row. Code fields:
 *   nibbles (128 bytes): byte 32 (s / 2) + p holds step s's code in its low nibble (s even) or
 *                        high nibble (s odd): one 32-byte load gives two steps;
 *   fifth bits (32):     bit s of byte p (Q5_0, Q5_1, Q5_K);
 *   high bits (64):      bits 2 (s % 4), +1 of byte 32 (s / 4) + p (Q6_K's two high bits);
 *   bytes (256):         byte 32 s + p (Q8_0's signed codes).
 * Records (scales as f16, in row order; "x 8" means one per row):
 *   Q4_0  [d x 8][nibbles]                                  144 bytes, = 8 stored blocks
 *   Q4_1  [d x 8][m x 8][nibbles]                           160
 *   Q5_0  [d x 8][fifth bits][nibbles]                      176
 *   Q5_1  [d x 8][m x 8][fifth bits][nibbles]               192
 *   Q8_0  [d x 8][bytes]                                    272
 *   Q4_K  [d x 8][dmin x 8][sc: 8 sub-blocks x 8 rows, u8][m: same][nibbles x 8 sub-blocks]
 *                                                           1184 (8 stored blocks: 1152)
 *   Q5_K  as Q4_K with [fifth bits x 8 sub-blocks] before the nibbles   1440 (1408)
 *   Q6_K  [d x 8][scales: per sub-block 16 i8, (sc_a, sc_b) of row 0, row 1, ...]
 *         [high bits x 8 sub-blocks][nibbles x 8 sub-blocks]             1680 (= 8 x 210)
 *   BF16  a group is two halves, rows 0-3 then rows 4-7; a half is K / 8 records of 64 bytes,
 *         values 8i .. 8i + 7 of each of its 4 rows in turn. The values are the stored ones; the
 *         float row kernel reads a half as one stream (a stored matrix's short rows, read 4 side
 *         by side, went at 86-93% of the bandwidth probe where one stream went at 100-109%).
 * The k-quants' 6-bit scales and mins are unpacked to bytes (the 2.8 % and 2.3 % more), so a
 * product reads them with one widening load. Codes keep their stored offsets (Q4_0 8, Q5_0 16,
 * Q6_K 32): they go into the byte products unsigned, and the offset times the act block's code
 * sum comes off in integers. A Q6_K sub-block's two 16-value groups are its values 0-15 (steps
 * 0-3) and 16-31 (steps 4-7).
 */
#include "kernels.h"
#include "qblock.h"

#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------- layouts */

enum { NIB = 128, FIFTH = 32, HIGH = 64, BYTES = 256 };

/* Field offsets of a type's record; -1 where the type has no such field. */
typedef struct {
    int dtype, bs, bytes;     /* values per block, bytes per record */
    int off;                  /* code offset taken off in integers */
    int d, m, dmin, sc, mins, fifth, high, nib, q8;
} layout;

static const layout LAYOUTS[] = {
    {QW_Q4_0, 32, 144, 8, 0, -1, -1, -1, -1, -1, -1, 16, -1},
    {QW_Q4_1, 32, 160, 0, 0, 16, -1, -1, -1, -1, -1, 32, -1},
    {QW_Q5_0, 32, 176, 16, 0, -1, -1, -1, -1, 16, -1, 48, -1},
    {QW_Q5_1, 32, 192, 0, 0, 16, -1, -1, -1, 32, -1, 64, -1},
    {QW_Q8_0, 32, 272, 0, 0, -1, -1, -1, -1, -1, -1, -1, 16},
    {QW_Q4_K, 256, 1184, 0, 0, -1, 16, 32, 96, -1, -1, 160, -1},
    {QW_Q5_K, 256, 1440, 0, 0, -1, 16, 32, 96, 160, -1, 416, -1},
    {QW_Q6_K, 256, 1680, 32, 0, -1, -1, 16, -1, -1, 144, 656, -1},
};

static const layout *layout_of(int dtype) {
    for (size_t i = 0; i < sizeof LAYOUTS / sizeof LAYOUTS[0]; i++)
        if (LAYOUTS[i].dtype == dtype) return &LAYOUTS[i];
    return NULL;
}

int qw_r8_of(int dtype) { return layout_of(dtype) || dtype == QW_BF16 ? QW_R8 + dtype : 0; }

size_t qw_r8_group_bytes(int dtype, int64_t K) {
    if (dtype == QW_BF16) return K % 8 ? 0 : (size_t)K * 8 * sizeof(uint16_t);
    const layout *t = layout_of(dtype);
    return t ? (size_t)(K / t->bs) * (size_t)t->bytes : 0;
}

/* Where value k of row r (0-7) of a BF16 group lies, in 16-bit words from the group's start. */
static inline size_t bf16_at(int64_t K, int r, int64_t k) {
    return (size_t)(r / 4) * (size_t)(4 * K) + (size_t)(k / 8) * 32 + (size_t)(r % 4) * 8 + (size_t)(k % 8);
}

/* Where value v of row r of a 32-value block lies: its step and position. */
static inline int step_of(int v) { return v >> 2; }
static inline int pos_of(int r, int v) { return 4 * r + (v & 3); }

static inline int get_nib(const uint8_t *nib, int r, int v) {
    int s = step_of(v);
    return (nib[32 * (s >> 1) + pos_of(r, v)] >> (4 * (s & 1))) & 15;
}

static inline int get_fifth(const uint8_t *fifth, int r, int v) { return (fifth[pos_of(r, v)] >> step_of(v)) & 1; }

static inline int get_high(const uint8_t *high, int r, int v) {
    int s = step_of(v);
    return (high[32 * (s >> 2) + pos_of(r, v)] >> (2 * (s & 3))) & 3;
}

static inline uint8_t *byte_at(uint8_t *bytes, int r, int v) { return bytes + 32 * step_of(v) + pos_of(r, v); }

static void put_f16(uint8_t *rec, int field, int r, uint16_t h) { memcpy(rec + field + 2 * r, &h, 2); }
static uint16_t get_f16(const uint8_t *rec, int field, int r) { return rd_u16(rec + field + 2 * r); }

/* ---------------------------------------------------------------- repacking
 *
 * Stored block -> its row's place in a record: the codes (unsigned, offsets kept) and scales.
 * A row's 4 positions in a step vector are 4 consecutive bytes, so codes move 4 at a time. */

static inline uint32_t rd4(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* 32 codes of row r (bytes, low 4 bits used) into a nibble field. */
static void put_nibbles32(uint8_t *nib, int r, const uint8_t *q) {
    for (int v = 0; v < 4; v++) {
        uint32_t w = (rd4(q + 8 * v) & 0x0F0F0F0Fu) | (rd4(q + 8 * v + 4) & 0x0F0F0F0Fu) << 4;
        memcpy(nib + 32 * v + 4 * r, &w, 4);
    }
}

/* Bit 4 of 32 codes of row r into a fifth-bit field. */
static void put_fifth32(uint8_t *fifth, int r, const uint8_t *q) {
    for (int t = 0; t < 4; t++) {
        unsigned byte = 0;
        for (int s = 0; s < 8; s++) byte |= ((q[4 * s + t] >> 4) & 1u) << s;
        fifth[4 * r + t] = (uint8_t)byte;
    }
}

/* Bits 4-5 of 32 codes of row r into a high-bit field. */
static void put_high32(uint8_t *high, int r, const uint8_t *q) {
    for (int h = 0; h < 2; h++)
        for (int t = 0; t < 4; t++) {
            unsigned byte = 0;
            for (int u = 0; u < 4; u++) byte |= ((q[4 * (4 * h + u) + t] >> 4) & 3u) << (2 * u);
            high[32 * h + 4 * r + t] = (uint8_t)byte;
        }
}

static void repack_row_block(const layout *t, const uint8_t *b, int r, uint8_t *rec) {
    uint8_t q[256];
    switch (t->dtype) {
    case QW_Q4_0: case QW_Q4_1: case QW_Q5_0: case QW_Q5_1: {
        int has_m = t->dtype == QW_Q4_1 || t->dtype == QW_Q5_1, five = t->dtype == QW_Q5_0 || t->dtype == QW_Q5_1;
        const uint8_t *qs = b + 2 + 2 * has_m + 4 * five;
        if (five)
            unpack_nibbles5(qs, b + 2 + 2 * has_m, 0, (int8_t *)q);
        else
            unpack_nibbles(qs, 0, (int8_t *)q);
        put_f16(rec, t->d, r, rd_u16(b));
        if (has_m) put_f16(rec, t->m, r, rd_u16(b + 2));
        put_nibbles32(rec + t->nib, r, q);
        if (five) put_fifth32(rec + t->fifth, r, q);
        return;
    }
    case QW_Q8_0:
        put_f16(rec, t->d, r, rd_u16(b));
        for (int s = 0; s < 8; s++) memcpy(rec + t->q8 + 32 * s + 4 * r, b + 2 + 4 * s, 4);
        return;
    case QW_Q4_K: case QW_Q5_K: {
        int five = t->dtype == QW_Q5_K;
        const uint8_t *qh = five ? b + 16 : NULL, *qs = b + (five ? 48 : 16);
        put_f16(rec, t->d, r, rd_u16(b));
        put_f16(rec, t->dmin, r, rd_u16(b + 2));
        for (int j = 0; j < 8; j++) {
            int sc, m;
            kquant_scale_min(b + 4, j, &sc, &m);
            rec[t->sc + 8 * j + r] = (uint8_t)sc;
            rec[t->mins + 8 * j + r] = (uint8_t)m;
            unpack_kquant(qs, qh, j, (int8_t *)q);
            put_nibbles32(rec + t->nib + NIB * j, r, q);
            if (five) put_fifth32(rec + t->fifth + FIFTH * j, r, q);
        }
        return;
    }
    case QW_Q6_K:
        put_f16(rec, t->d, r, rd_u16(b + 208));
        for (int j = 0; j < 8; j++) {
            rec[t->sc + 16 * j + 2 * r] = b[192 + 2 * j];
            rec[t->sc + 16 * j + 2 * r + 1] = b[192 + 2 * j + 1];
        }
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++) {
                for (int l = 0; l < 32; l++) q[l] = (uint8_t)q6k_code(b + 64 * h, b + 128 + 32 * h, k, l);
                put_nibbles32(rec + t->nib + NIB * (4 * h + k), r, q);
                put_high32(rec + t->high + HIGH * (4 * h + k), r, q);
            }
        return;
    }
}

/* The stored block of row r of a record (the inverse of repack_row_block, byte for byte). */
static void unpack_row_block(const layout *t, const uint8_t *rec, int r, uint8_t *b) {
    switch (t->dtype) {
    case QW_Q4_0: case QW_Q4_1: case QW_Q5_0: case QW_Q5_1: {
        int has_m = t->dtype == QW_Q4_1 || t->dtype == QW_Q5_1, five = t->dtype == QW_Q5_0 || t->dtype == QW_Q5_1;
        uint16_t d = get_f16(rec, t->d, r);
        memcpy(b, &d, 2);
        if (has_m) {
            uint16_t m = get_f16(rec, t->m, r);
            memcpy(b + 2, &m, 2);
        }
        uint8_t *qs = b + 2 + 2 * has_m + 4 * five;
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++)
            qs[j] = (uint8_t)(get_nib(rec + t->nib, r, j) | get_nib(rec + t->nib, r, j + 16) << 4);
        if (five) {
            for (int v = 0; v < 32; v++) qh |= (uint32_t)get_fifth(rec + t->fifth, r, v) << v;
            memcpy(b + 2 + 2 * has_m, &qh, 4);
        }
        return;
    }
    case QW_Q8_0: {
        uint16_t d = get_f16(rec, t->d, r);
        memcpy(b, &d, 2);
        for (int v = 0; v < 32; v++) b[2 + v] = *byte_at((uint8_t *)rec + t->q8, r, v);
        return;
    }
    case QW_Q4_K: case QW_Q5_K: {
        int five = t->dtype == QW_Q5_K;
        uint16_t d = get_f16(rec, t->d, r), dmin = get_f16(rec, t->dmin, r);
        memcpy(b, &d, 2);
        memcpy(b + 2, &dmin, 2);
        uint8_t *s = b + 4, *qh = b + 16, *qs = b + (five ? 48 : 16);
        int sc[8], m[8];
        for (int j = 0; j < 8; j++) {
            sc[j] = rec[t->sc + 8 * j + r];
            m[j] = rec[t->mins + 8 * j + r];
        }
        for (int j = 0; j < 4; j++) {
            s[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
            s[j + 4] = (uint8_t)(m[j] | (m[j + 4] >> 4) << 6);
            s[j + 8] = (uint8_t)((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
        }
        if (five) memset(qh, 0, 32);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                qs[32 * c + l] = (uint8_t)(get_nib(rec + t->nib + NIB * 2 * c, r, l) |
                                           get_nib(rec + t->nib + NIB * (2 * c + 1), r, l) << 4);
        if (five)
            for (int j = 0; j < 8; j++)
                for (int l = 0; l < 32; l++) qh[l] |= (uint8_t)(get_fifth(rec + t->fifth + FIFTH * j, r, l) << j);
        return;
    }
    case QW_Q6_K: {
        uint16_t d = get_f16(rec, t->d, r);
        memcpy(b + 208, &d, 2);
        for (int j = 0; j < 8; j++) {
            b[192 + 2 * j] = rec[t->sc + 16 * j + 2 * r];
            b[192 + 2 * j + 1] = rec[t->sc + 16 * j + 2 * r + 1];
        }
        memset(b, 0, 192);
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < 32; l++) {
                    int j = 4 * h + k;
                    int code = get_nib(rec + t->nib + NIB * j, r, l) | get_high(rec + t->high + HIGH * j, r, l) << 4;
                    b[64 * h + l + 32 * (k & 1)] |= (uint8_t)((code & 15) << (k >= 2 ? 4 : 0));
                    b[128 + 32 * h + l] |= (uint8_t)((code >> 4) << (2 * k));
                }
        return;
    }
    }
}

void qw_repack_group(int dtype, const uint8_t *src, size_t stride, int n, int64_t K, uint8_t *group) {
    if (dtype == QW_BF16) {
        uint16_t *g = (uint16_t *)group;
        if (K % 8) return;
        memset(group, 0, qw_r8_group_bytes(dtype, K));
        for (int r = 0; r < n; r++)
            for (int64_t k = 0; k < K; k += 8) memcpy(g + bf16_at(K, r, k), src + (size_t)r * stride + (size_t)k * 2, 16);
        return;
    }
    const layout *t = layout_of(dtype);
    if (!t) return;
    int64_t nb = K / t->bs;
    size_t bb = (size_t)qw_block_bytes(dtype);
    memset(group, 0, (size_t)nb * (size_t)t->bytes);
    for (int64_t i = 0; i < nb; i++)
        for (int r = 0; r < n; r++) repack_row_block(t, src + (size_t)r * stride + (size_t)i * bb, r, group + (size_t)i * (size_t)t->bytes);
}

void qw_repack_r8(int dtype, const void *src, int64_t N, int64_t K, void *dst) {
    size_t stride = qw_row_bytes(dtype, K), gb = qw_r8_group_bytes(dtype, K);
    if (!gb) return;
    int64_t groups = (N + 7) / 8;
#pragma omp parallel for num_threads(qw_get_threads()) schedule(static)
    for (int64_t g = 0; g < groups; g++) {
        int n = N - 8 * g < 8 ? (int)(N - 8 * g) : 8;
        qw_repack_group(dtype, (const uint8_t *)src + (size_t)(8 * g) * stride, stride, n, K, (uint8_t *)dst + (size_t)g * gb);
    }
}

void qw_dequant_matrix_row(int dtype, const void *W, int64_t K, int64_t n, float *dst) {
    if (dtype < QW_R8) {
        qw_dequant_row(dtype, (const uint8_t *)W + (size_t)n * qw_row_bytes(dtype, K), dst, K);
        return;
    }
    if (dtype == QW_R8 + QW_BF16 && K % 8 == 0) {
        const uint16_t *g = (const uint16_t *)((const uint8_t *)W + (size_t)(n / 8) * qw_r8_group_bytes(QW_BF16, K));
        for (int64_t k = 0; k < K; k += 8) qw_dequant_row(QW_BF16, g + bf16_at(K, (int)(n % 8), k), dst + k, 8);
        return;
    }
    const layout *t = layout_of(dtype - QW_R8);
    if (!t) {
        memset(dst, 0, (size_t)K * sizeof(float));
        return;
    }
    const uint8_t *g = (const uint8_t *)W + (size_t)(n / 8) * qw_r8_group_bytes(t->dtype, K);
    uint8_t block[256];
    for (int64_t i = 0; i < K / t->bs; i++) {
        unpack_row_block(t, g + (size_t)i * (size_t)t->bytes, (int)(n % 8), block);
        qw_dequant_row(t->dtype, block, dst + i * t->bs, t->bs);
    }
}

void qw_dequant_matrix_rows(int dtype, const void *W, int64_t K, int64_t n0, int64_t nb, float *dst) {
#if QW_HAVE_X86
    if (dtype == QW_R8 + QW_BF16 && K % 8 == 0 && n0 % 8 == 0 && qw_use_avx2()) { /* each half's lines once, in order */
        size_t gb = qw_r8_group_bytes(QW_BF16, K);
        for (int64_t j0 = 0; j0 < nb; j0 += 4) {
            const uint16_t *half = (const uint16_t *)((const uint8_t *)W + (size_t)((n0 + j0) / 8) * gb) +
                                   (size_t)((n0 + j0) % 8 / 4) * 4 * (size_t)K;
            qw_dequant_bf16_half_avx2(half, nb - j0 < 4 ? (int)(nb - j0) : 4, K, dst + j0 * K);
        }
        return;
    }
#endif
    for (int64_t j = 0; j < nb; j++) qw_dequant_matrix_row(dtype, W, K, n0 + j, dst + j * K);
}

/* ---------------------------------------------------------------- plain products
 *
 * quant.h's order with a separate multiply and add. The codes of a record are taken out for all
 * 8 rows once and serve every act row. The act rows' code sums are recomputed from their codes
 * here (never read from s or bsums), which makes this path an independent check of those. */

typedef struct {
    int16_t q[8][256];  /* codes with the offset taken off */
    float d[8], dmin[8];
    int sc[8][16];      /* k-quants: per sub-block (Q6_K: per 16-value group) */
    float m[8][8];      /* the min of each sub-block (Q4_1/Q5_1: m; Q4_K/Q5_K: dmin * m) */
} record_codes;

static void take_codes(const layout *t, const uint8_t *rec, record_codes *c) {
    int subs = t->bs / 32;
    for (int r = 0; r < 8; r++) {
        c->d[r] = qw_f16_to_f32(get_f16(rec, t->d, r));
        for (int j = 0; j < subs; j++)
            for (int v = 0; v < 32; v++) {
                int code;
                if (t->q8 >= 0)
                    code = (int8_t)*byte_at((uint8_t *)rec + t->q8, r, v);
                else {
                    code = get_nib(rec + t->nib + NIB * j, r, v);
                    if (t->fifth >= 0) code |= get_fifth(rec + t->fifth + FIFTH * j, r, v) << 4;
                    if (t->high >= 0) code |= get_high(rec + t->high + HIGH * j, r, v) << 4;
                }
                c->q[r][32 * j + v] = (int16_t)(code - t->off);
            }
        if (t->m >= 0) c->m[r][0] = qw_f16_to_f32(get_f16(rec, t->m, r));
        if (t->dmin >= 0) {
            float dmin = qw_f16_to_f32(get_f16(rec, t->dmin, r));
            for (int j = 0; j < 8; j++) {
                c->sc[r][j] = rec[t->sc + 8 * j + r];
                c->m[r][j] = dmin * (float)rec[t->mins + 8 * j + r];
            }
        } else if (t->dtype == QW_Q6_K) {
            for (int j = 0; j < 8; j++) {
                c->sc[r][2 * j] = (int8_t)rec[t->sc + 16 * j + 2 * r];
                c->sc[r][2 * j + 1] = (int8_t)rec[t->sc + 16 * j + 2 * r + 1];
            }
        }
    }
}

/* Row r's exact sum of codes times act codes x over values [v0, v0 + len) of sub-block j. */
static int32_t code_sum(const record_codes *c, int r, int j, const int8_t *x, int v0, int len) {
    const int16_t *q = c->q[r] + 32 * j;
    int32_t s = 0;
    for (int v = v0; v < v0 + len; v++) s += q[v] * x[v];
    return s;
}

static void product_plain(const layout *t, int bits, const uint8_t *g, int64_t K, const uint8_t *xq, size_t xstride,
                          int64_t M, float *out) {
    float acc[QW_R8_MAX_M][8] = {{0}}, macc[QW_R8_MAX_M][8] = {{0}};
    record_codes codes, *c = &codes;
    int subs = t->bs / 32, levels = bits == 16 ? 2 : 1, has_min = t->m >= 0 || t->dmin >= 0;
    int groups = t->dtype == QW_Q6_K ? 2 : 1, len = 32 / groups; /* Q6_K: a scale per 16 values */
    for (int64_t i = 0; i < K / t->bs; i++) {
        take_codes(t, g + (size_t)i * (size_t)t->bytes, c);
        for (int j = 0; j < subs; j++) {
            int64_t b = i * subs + j;
            for (int64_t m = 0; m < M; m++) {
                const int8_t *row = (const int8_t *)(xq + (size_t)m * xstride);
                const int8_t *last = row + (size_t)(levels - 1) * ACT_HALF(K);
                float dx = ACT_D(last, K)[b];
                int32_t xs = 0; /* the act block's code sum, a 16-bit row's levels joined as 256 s1 + s2 */
                for (int lv = 0; lv < levels; lv++) {
                    const int8_t *x = row + (size_t)lv * ACT_HALF(K) + 32 * b;
                    int32_t ls = 0;
                    for (int v = 0; v < 32; v++) ls += x[v];
                    xs = 256 * xs + ls;
                }
                float s = dx * (float)xs;
                for (int r = 0; r < 8; r++) {
                    for (int h = 0; h < groups; h++) {
                        int32_t I = 0;
                        for (int lv = 0; lv < levels; lv++)
                            I = 256 * I + code_sum(c, r, j, row + (size_t)lv * ACT_HALF(K) + 32 * b, h * len, len);
                        float S = c->d[r];
                        if (t->dtype == QW_Q6_K) S = S * (float)c->sc[r][2 * j + h];
                        else if (t->dmin >= 0) S = S * (float)c->sc[r][j];
                        acc[m][r] = acc[m][r] + (float)I * (S * dx);
                    }
                    if (has_min) macc[m][r] = macc[m][r] + c->m[r][t->m >= 0 ? 0 : j] * s;
                }
            }
        }
    }
    for (int64_t m = 0; m < M; m++)
        for (int r = 0; r < 8; r++) out[m * 8 + r] = t->dmin >= 0 ? acc[m][r] - macc[m][r] : acc[m][r] + macc[m][r];
}

#define PLAIN(T, BITS)                                                                                          \
    static void plain_##T##_##BITS(const uint8_t *g, int64_t K, const uint8_t *xq, size_t xs, int64_t M, float *out) { \
        product_plain(layout_of(T), BITS, g, K, xq, xs, M, out);                                                 \
    }
#define PLAIN_TYPE(T) PLAIN(T, 8) PLAIN(T, 16)
PLAIN_TYPE(QW_Q4_0)
PLAIN_TYPE(QW_Q4_1)
PLAIN_TYPE(QW_Q5_0)
PLAIN_TYPE(QW_Q5_1)
PLAIN_TYPE(QW_Q8_0)
PLAIN_TYPE(QW_Q4_K)
PLAIN_TYPE(QW_Q5_K)
PLAIN_TYPE(QW_Q6_K)

qw_r8_fn qw_r8_kernel(int dtype, int bits) {
    if (bits != 8 && bits != 16) return NULL;
#if QW_HAVE_X86
    if (qw_use_avx512()) return qw_r8_kernel_avx512(dtype, bits);
    if (qw_use_avx2()) return qw_r8_kernel_avx2(dtype, bits);
#endif
#define CASE(T) case T: return bits == 16 ? plain_##T##_16 : plain_##T##_8;
    switch (dtype) {
    CASE(QW_Q4_0) CASE(QW_Q4_1) CASE(QW_Q5_0) CASE(QW_Q5_1) CASE(QW_Q8_0) CASE(QW_Q4_K) CASE(QW_Q5_K) CASE(QW_Q6_K)
    default: return NULL;
    }
#undef CASE
}

qw_r8_fn qw_r8_kernel_pairs(int dtype, int bits) {
    if (bits != 8 && bits != 16) return NULL;
#if QW_HAVE_X86
    if (qw_use_avx512w()) return qw_r8_kernel_avx512w(dtype, bits);
#endif
    (void)dtype;
    return NULL;
}

qw_r8_two_fn qw_r8_kernel_pairs2(int dtype, int bits) {
#if QW_HAVE_X86
    if (qw_use_avx512w()) return qw_r8_kernel_avx512w2(dtype, bits);
#endif
    (void)dtype;
    (void)bits;
    return NULL;
}

qw_r8_fn qw_r8_kernel_vertical(int dtype) {
#if QW_HAVE_X86
    if (qw_use_avx2() && !qw_use_avx512()) return qw_r8_kernel_vertical_avx2(dtype);
#endif
    (void)dtype;
    return NULL;
}

qw_amx_fn qw_amx_kernel(int dtype, int bits) {
    if (bits != 8 && bits != 16) return NULL;
#if QW_HAVE_X86
    if (qw_use_amx()) return qw_amx_kernel_x86(dtype, bits);
#endif
    (void)dtype;
    return NULL;
}

qw_amx_fn qw_amx_kernel_bf16(int dtype) {
#if QW_HAVE_X86
    if (qw_use_amx_bf16()) return qw_amx_kernel_bf16_x86(dtype);
#endif
    (void)dtype;
    return NULL;
}

/* ---------------------------------------------------------------- one row */

/* One stored row repacked into a group of its own, through kernel k. */
static float dot_row_r8(qw_r8_fn k, int dtype, const void *row, const void *xq, int64_t n) {
    size_t gb = qw_r8_group_bytes(dtype, n);
    uint8_t *g = qw_alloc(gb);
    if (!g) return NAN;
    float out[8];
    qw_repack_group(dtype, row, 0, 1, n, g);
    k(g, n, xq, 0, 1, out);
    qw_free(g);
    return out[0];
}

float qw_dot_row_act(int dtype, const void *row, const void *xq, int64_t n, int bits) {
    qw_r8_fn k = qw_r8_kernel(dtype, bits);
    if (!k || !qw_r8_group_bytes(dtype, n)) return 0.0f;
    return dot_row_r8(k, dtype, row, xq, n);
}

float qw_dot_row_joined(int dtype, const void *row, const void *xj, int64_t n) {
    qw_r8_fn k = qw_r8_kernel_vertical(dtype);
    if (!k || !qw_r8_group_bytes(dtype, n)) return NAN;
    uint8_t *v = qw_alloc(VERT_BYTES(n));
    if (!v) return NAN;
    qw_vertical_act_rows(xj, 0, 1, v, n);
    float r = dot_row_r8(k, dtype, row, v, n);
    qw_free(v);
    return r;
}
