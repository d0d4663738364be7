/* The x86 integer products' shared body: unpacking a record's block into 8 step vectors, and the
 * loop over records, sub-blocks, act rows and levels (intdot.c describes the layouts).
 *
 * Included once by intdot_avx2.c and once by intdot_avx512.c, which differ only in how a block's
 * 32 codes meet the act codes: vpmaddubsw + vpmaddwd on AVX2, vpdpbusd (AVX-512 VNNI on 256-bit
 * vectors) there. Before including it a file defines R8_TARGET (its target attribute) and
 * R8_GETTER (the name of its kernel table), and after it the two hooks declared below. Both
 * give the same exact integer block sums, and the float work after them is this file's, so every
 * path gives the same bits. */
#ifndef QWENC_INTDOT_X86_H
#define QWENC_INTDOT_X86_H

#define INLINE __attribute__((always_inline)) static inline

R8_TARGET INLINE __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* 4 act codes broadcast to every row's position (one load: the broadcast comes from memory). */
R8_TARGET INLINE __m256i bcast4(const int8_t *x) {
    int32_t v;
    memcpy(&v, x, 4);
    return _mm256_set1_epi32(v);
}

/* 8 rows' f16 fields as floats. */
R8_TARGET INLINE __m256 f16x8(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* ---------------------------------------------------------------- unpacking a block */

/* The low 4 bits of the 8 steps from 128 bytes of nibbles. */
R8_TARGET INLINE void unpack_nibbles8(const uint8_t *nib, __m256i c[8]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int v = 0; v < 4; v++) {
        __m256i w = load32(nib + 32 * v);
        c[2 * v] = _mm256_and_si256(w, m4);
        c[2 * v + 1] = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
    }
}

/* Bit s of each byte of the fifth-bit vector moved to bit 4 of step s (16-bit shifts are safe:
 * the mask keeps only bit 4 of each byte, which came from the same byte). */
R8_TARGET INLINE void add_fifth_bits(const uint8_t *fifth, __m256i c[8]) {
    const __m256i b4 = _mm256_set1_epi8(0x10);
    __m256i h = load32(fifth);
    c[0] = _mm256_or_si256(c[0], _mm256_and_si256(_mm256_slli_epi16(h, 4), b4));
    c[1] = _mm256_or_si256(c[1], _mm256_and_si256(_mm256_slli_epi16(h, 3), b4));
    c[2] = _mm256_or_si256(c[2], _mm256_and_si256(_mm256_slli_epi16(h, 2), b4));
    c[3] = _mm256_or_si256(c[3], _mm256_and_si256(_mm256_slli_epi16(h, 1), b4));
    c[4] = _mm256_or_si256(c[4], _mm256_and_si256(h, b4));
    c[5] = _mm256_or_si256(c[5], _mm256_and_si256(_mm256_srli_epi16(h, 1), b4));
    c[6] = _mm256_or_si256(c[6], _mm256_and_si256(_mm256_srli_epi16(h, 2), b4));
    c[7] = _mm256_or_si256(c[7], _mm256_and_si256(_mm256_srli_epi16(h, 3), b4));
}

/* Q6_K: bits 2t, 2t + 1 of the high-bit vectors moved to bits 4, 5 of step 4 h + t. */
R8_TARGET INLINE void add_high_bits(const uint8_t *high, __m256i c[8]) {
    const __m256i b45 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; h++) {
        __m256i v = load32(high + 32 * h);
        c[4 * h] = _mm256_or_si256(c[4 * h], _mm256_and_si256(_mm256_slli_epi16(v, 4), b45));
        c[4 * h + 1] = _mm256_or_si256(c[4 * h + 1], _mm256_and_si256(_mm256_slli_epi16(v, 2), b45));
        c[4 * h + 2] = _mm256_or_si256(c[4 * h + 2], _mm256_and_si256(v, b45));
        c[4 * h + 3] = _mm256_or_si256(c[4 * h + 3], _mm256_and_si256(_mm256_srli_epi16(v, 2), b45));
    }
}

/* The act block's code sum (from its two 16-value sums) times `off`, in every lane: the pair
 * broadcast as one 32-bit load, and vpmaddwd by (off, off). */
R8_TARGET INLINE __m256i offset_sums(const int16_t *bs, int off) {
    int32_t pair;
    memcpy(&pair, bs, 4);
    return _mm256_madd_epi16(_mm256_set1_epi32(pair), _mm256_set1_epi16((short)off));
}

/* Q6_K's offset of 16-value group g (0 or 1): 32 times the act group's code sum, in every lane
 * (vpmaddwd of the broadcast (bsum_a, bsum_b) pair by (32, 0) or (0, 32)). */
R8_TARGET INLINE __m256i q6_offset(const int16_t *bs, int g) {
    int32_t pair;
    memcpy(&pair, bs, 4);
    return _mm256_madd_epi16(_mm256_set1_epi32(pair), _mm256_set1_epi32(g ? 32 << 16 : 32));
}

/* ---------------------------------------------------------------- the hooks
 *
 * unpack_q8: Q8_0's 8 steps of signed codes, as block_sum wants them.
 * block_sum: the 8 rows' exact sums of the block's codes times the 32 act codes at x, the code
 *   offsets (Q4_0, Q5_0, Q6_K) taken off with the act block's code sums bs; for Q6_K the sum of
 *   its first 16-value group, the second's going to *second. */
R8_TARGET INLINE void unpack_q8(const uint8_t *codes, __m256i c[8]);
#ifndef R8_UNPACK_ONLY
R8_TARGET INLINE __m256i block_sum(int T, const __m256i c[8], const int8_t *x, const int16_t *bs, __m256i *second);
#endif

/* ---------------------------------------------------------------- the product
 *
 * T and BITS are constants in each instantiation below, so every type test folds away. For each
 * record and sub-block: unpack once, then for each act row its exact block sum I (a 16-bit row's
 * two levels joined in integers, 256 I1 + I2) and acc = fma(I, S dx, acc) (and macc = fma(M, s,
 * macc)) on the 8 rows' lanes. */

#define IS_K(T) ((T) == QW_Q4_K || (T) == QW_Q5_K || (T) == QW_Q6_K)
/* The types whose rows carry a min (Q4_1, Q5_1: added; Q4_K, Q5_K: subtracted). */
#define HAS_MIN(T) ((T) == QW_Q4_1 || (T) == QW_Q5_1 || (T) == QW_Q4_K || (T) == QW_Q5_K)

/* Bytes of one record (a block of 8 rows; intdot.c's layouts). */
INLINE int record_bytes(const int T) {
    return T == QW_Q4_0 ? 144 : T == QW_Q4_1 ? 160 : T == QW_Q5_0 ? 176 : T == QW_Q5_1 ? 192 :
           T == QW_Q8_0 ? 272 : T == QW_Q4_K ? 1184 : T == QW_Q5_K ? 1440 : 1680;
}

/* 8 bytes (one per row) as floats. */
R8_TARGET INLINE __m256 u8x8_ps(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* Q4_K's and Q5_K's min factors of sub-block j: each row's Dmin times its 6-bit min. */
R8_TARGET INLINE __m256 sub_mins(const uint8_t *rec, int j, __m256 Dmin) {
    return _mm256_mul_ps(Dmin, u8x8_ps(rec + 96 + 8 * j));
}

/* Sub-block j of record rec unpacked: its 8 step vectors c, each row's block scale S (D, times
 * a k-quant's sub-block scale: products of an f16 and a 6- or 8-bit integer, exact in float32;
 * for Q6_K its first 16-value group's, the second's in *Sb) and, for Q4_K and Q5_K, each row's
 * min factor Dmin min_j into *Mv (left as it is for the other types). */
R8_TARGET INLINE void unpack_sub(const int T, const uint8_t *rec, int j, __m256 D, __m256 Dmin, __m256i c[8],
                                 __m256 *S, __m256 *Sb, __m256 *Mv) {
    *S = *Sb = D;
    switch (T) {
    case QW_Q4_0: case QW_Q4_1: unpack_nibbles8(rec + (T == QW_Q4_0 ? 16 : 32), c); break;
    case QW_Q5_0: unpack_nibbles8(rec + 48, c); add_fifth_bits(rec + 16, c); break;
    case QW_Q5_1: unpack_nibbles8(rec + 64, c); add_fifth_bits(rec + 32, c); break;
    case QW_Q8_0: unpack_q8(rec + 16, c); break;
    case QW_Q4_K: case QW_Q5_K:
        if (T == QW_Q4_K)
            unpack_nibbles8(rec + 160 + 128 * j, c);
        else {
            unpack_nibbles8(rec + 416 + 128 * j, c);
            add_fifth_bits(rec + 160 + 32 * j, c);
        }
        *S = _mm256_mul_ps(D, u8x8_ps(rec + 32 + 8 * j));
        *Mv = sub_mins(rec, j, Dmin);
        break;
    default: { /* Q6_K: (sc_a, sc_b) per row as signed bytes */
        unpack_nibbles8(rec + 656 + 128 * j, c);
        add_high_bits(rec + 144 + 64 * j, c);
        const __m256i kab = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(rec + 16 + 16 * j)));
        *S = _mm256_mul_ps(D, _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(kab, 16), 16)));
        *Sb = _mm256_mul_ps(D, _mm256_cvtepi32_ps(_mm256_srai_epi32(kab, 16)));
    }
    }
}

/* Record rec's scale D of each row (the return value) and its min factors: Q4_1's and Q5_1's mins
 * into *Mv, Q4_K's and Q5_K's Dmin into *Dmin (which unpack_sub scales per sub-block); zero where
 * the type has none. */
R8_TARGET INLINE __m256 record_scales(const int T, const uint8_t *rec, __m256 *Mv, __m256 *Dmin) {
    *Mv = *Dmin = _mm256_setzero_ps();
    if (T == QW_Q4_1 || T == QW_Q5_1) *Mv = f16x8(rec + 16);
    if (T == QW_Q4_K || T == QW_Q5_K) *Dmin = f16x8(rec + 16);
    return f16x8(rec);
}

/* The 8 rows' products from their float sums: the mins' sums added (Q4_1, Q5_1) or taken off
 * (Q4_K, Q5_K). */
R8_TARGET INLINE __m256 with_mins(const int T, __m256 acc, __m256 macc) {
    if (T == QW_Q4_1 || T == QW_Q5_1) return _mm256_add_ps(acc, macc);
    if (T == QW_Q4_K || T == QW_Q5_K) return _mm256_sub_ps(acc, macc);
    return acc;
}

/* Every stored type with a kernel, as X(type, name): instantiates the kernels and their tables.
 * The rest of this file (the products over act rows and their table) is left out where a file
 * takes only the unpacking (R8_UNPACK_ONLY: intdot_amx.c). */
#define R8_TYPES(X) X(QW_Q4_0, q4_0) X(QW_Q4_1, q4_1) X(QW_Q5_0, q5_0) X(QW_Q5_1, q5_1) \
                    X(QW_Q8_0, q8_0) X(QW_Q4_K, q4_k) X(QW_Q5_K, q5_k) X(QW_Q6_K, q6_k)
#ifndef R8_UNPACK_ONLY

/* An act row's exact sum for block b: level 1's (row x1) and, for a 16-bit row, level 2's (at
 * xl) joined as 256 I1 + I2; Q6_K's second group likewise into *ib. */
R8_TARGET INLINE __m256i row_sum(const int T, const int levels, const __m256i c[8], const int8_t *x1,
                                 const int8_t *xl, int64_t K, int64_t b, __m256i *ib) {
    __m256i ia = block_sum(T, c, x1 + 32 * b, ACT_BSUMS(x1, K) + 2 * b, ib);
    if (levels == 2) {
        __m256i jb = _mm256_setzero_si256();
        __m256i ja = block_sum(T, c, xl + 32 * b, ACT_BSUMS(xl, K) + 2 * b, &jb);
        ia = _mm256_add_epi32(_mm256_slli_epi32(ia, 8), ja);
        if (T == QW_Q6_K) *ib = _mm256_add_epi32(_mm256_slli_epi32(*ib, 8), jb);
    }
    return ia;
}

R8_TARGET INLINE void product(const int T, const int BITS, const uint8_t *g, int64_t K, const uint8_t *xq,
                              size_t xstride, int64_t M, float *out) {
    const int bs = IS_K(T) ? 256 : 32, subs = bs / 32, levels = BITS == 16 ? 2 : 1;
    const int rb = record_bytes(T);
    const int has_min = HAS_MIN(T);
    const size_t half = ACT_HALF(K);
    __m256 acc[QW_R8_MAX_M], macc[QW_R8_MAX_M];
    for (int64_t m = 0; m < M; m++) acc[m] = macc[m] = _mm256_setzero_ps();
    for (int64_t i = 0; i < K / bs; i++) {
        const uint8_t *rec = g + (size_t)i * (size_t)rb;
        __m256 Mv, Dmin;
        const __m256 D = record_scales(T, rec, &Mv, &Dmin);
        for (int j = 0; j < subs; j++) {
            const int64_t b = i * subs + j;
            qw_prefetch_share(rec, rb, subs, j);
            __m256i c[8];
            __m256 S, Sb;
            unpack_sub(T, rec, j, D, Dmin, c, &S, &Sb, &Mv);
            for (int64_t m = 0; m < M; m++) {
                const int8_t *row = (const int8_t *)(xq + (size_t)m * xstride);
                const int8_t *xl = row + (size_t)(levels - 1) * half; /* the last level: its d and s */
                __m256i ib = _mm256_setzero_si256(); /* Q6_K's second group */
                const __m256i ia = row_sum(T, levels, c, row, xl, K, b, &ib);
                const __m256 dx = _mm256_broadcast_ss(ACT_D(xl, K) + b);
                acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia), _mm256_mul_ps(S, dx), acc[m]);
                if (T == QW_Q6_K) acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ib), _mm256_mul_ps(Sb, dx), acc[m]);
                if (has_min) macc[m] = _mm256_fmadd_ps(Mv, _mm256_broadcast_ss(ACT_S(xl, K) + b), macc[m]);
            }
        }
    }
    for (int64_t m = 0; m < M; m++) _mm256_storeu_ps(out + 8 * m, with_mins(T, acc[m], macc[m]));
}

/* A lone act row (decode) is passed as the constant 1, so that its accumulators live in registers
 * rather than in the M-long arrays' stack slots (about 12% of 1.5B decode on AVX2). */
#define KERNEL(T, NAME, BITS)                                                                                   \
    R8_TARGET static void r8_##NAME##_##BITS(const uint8_t *g, int64_t K, const uint8_t *xq, size_t xs,          \
                                             int64_t M, float *out) {                                           \
        if (M == 1)                                                                                             \
            product(T, BITS, g, K, xq, xs, 1, out);                                                             \
        else                                                                                                    \
            product(T, BITS, g, K, xq, xs, M, out);                                                             \
    }
#define KERNELS(T, NAME) KERNEL(T, NAME, 8) KERNEL(T, NAME, 16)
R8_TYPES(KERNELS)

qw_r8_fn R8_GETTER(int dtype, int bits) {
#define CASE(T, NAME) case T: return bits == 16 ? r8_##NAME##_16 : r8_##NAME##_8;
    switch (dtype) {
    R8_TYPES(CASE)
    default: return NULL;
    }
#undef CASE
}

#endif /* R8_UNPACK_ONLY */

#endif
