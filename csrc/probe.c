/* The machine's yardsticks for `qwenc bench`: how fast it reads memory (what decode's weight
 * reads could at best go at) and how fast the integer kernels' multiply-add instruction runs
 * (what a prefill's products could at best go at). Neither is a model kernel: one bound by its
 * own extra work would make a faster model kernel show above 100% of it. */
#include "probe.h"

#include "cpu.h"

#include <string.h>

#if QW_HAVE_X86
#include <immintrin.h>
#endif

uint64_t qw_read_sum(const uint64_t *p, int64_t n_words) {
    uint64_t total = 0;
#pragma omp parallel num_threads(qw_get_threads()) reduction(+ : total)
    {
        /* four independent sums, so the loop is bound by the loads, not by an add chain */
        uint64_t a = 0, b = 0, c = 0, d = 0;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n_words / 4; i++) {
            a += p[4 * i];
            b += p[4 * i + 1];
            c += p[4 * i + 2];
            d += p[4 * i + 3];
        }
        total += a + b + c + d;
    }
    for (int64_t i = n_words & ~(int64_t)3; i < n_words; i++) total += p[i];
    return total;
}

/* Independent accumulator chains: enough that the instruction's latency (5 cycles on the CPUs
 * measured) hides behind its throughput. 12 chains reached 80% of what 24 did on an Intel Xeon. */
#define CHAINS 24
/* Every loop over the chains is unrolled, so the accumulators live in registers: left as a loop,
 * they were kept in memory and the probe measured a load and a store per instruction (about half
 * the rate of the model's kernels on an Intel Xeon). */
#define UNROLLED _Pragma("GCC unroll 24")
/* Values go through an empty asm so the compiler cannot fold them: the inputs each round (every
 * round executes) and each chain's start (chains it could prove equal would be computed once).
 * "v" reaches all 32 AVX-512 registers, "x" the 16 of AVX2. */
#define OPAQUE(v) __asm__ volatile("" : "+x"(v))
#define OPAQUE_V(v) __asm__ volatile("" : "+v"(v))

/* Every lane's products are of 1 by 1, so each multiply-add adds 1 to the sum of all lanes:
 * the returned sum is the number of multiply-adds, whatever the path (for at most SEGMENT rounds
 * per call, below). */

#if QW_HAVE_X86
__attribute__((target("avx2"))) static inline __m256i load32(const uint8_t *p) {
    return _mm256_load_si256((const __m256i *)p);
}

__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))) static uint64_t
peak_vnni512(int64_t rounds) {
    __m512i acc[CHAINS], u = _mm512_set1_epi8(1), s = _mm512_set1_epi8(1);
    UNROLLED for (int c = 0; c < CHAINS; c++) {
        acc[c] = _mm512_setzero_si512();
        OPAQUE_V(acc[c]);
    }
    for (int64_t r = 0; r < rounds; r++) {
        OPAQUE_V(u);
        UNROLLED for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_dpbusd_epi32(acc[c], u, s);
    }
    UNROLLED for (int c = 1; c < CHAINS; c++) acc[0] = _mm512_add_epi32(acc[0], acc[c]);
    uint32_t lanes[16];
    _mm512_storeu_si512(lanes, acc[0]);
    uint64_t sum = 0;
    for (int i = 0; i < 16; i++) sum += lanes[i];
    return sum;
}

/* The 512-bit loop with FP float multiply-adds (512-bit, on chains of their own) per 16 of its
 * instructions: the mix of the pair kernels' inner loop, which per block and pair of act rows
 * spends 16 vpdpbusd (int16; 8 for int8) and 2 to 4 float multiplies and FMAs (intdot_avx512.c).
 * Where the two kinds share execution ports (AMD Zen 4: each 512-bit FMA takes a vpdpbusd's
 * slot, measured), the integer rate this reaches is the ceiling of a kernel of that mix. */
__attribute__((always_inline, target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))) static inline uint64_t
peak_vnni512_fp(int64_t rounds, const int FP) {
    __m512i acc[16], u = _mm512_set1_epi8(1), s = _mm512_set1_epi8(1);
    __m512 f[QW_PEAK_MAX_FP], one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    const int step = FP ? 16 / FP : 16;
    UNROLLED for (int c = 0; c < 16; c++) {
        acc[c] = _mm512_setzero_si512();
        OPAQUE_V(acc[c]);
    }
    UNROLLED for (int c = 0; c < FP; c++) {
        f[c] = one;
        OPAQUE_V(f[c]);
    }
    for (int64_t r = 0; r < rounds; r++) {
        OPAQUE_V(u);
        OPAQUE_V(one);
        UNROLLED for (int c = 0; c < 16; c++) {
            acc[c] = _mm512_dpbusd_epi32(acc[c], u, s);
            /* the float work spread among the integer instructions, as in a kernel: FMA k after
             * instruction k * step */
            if (FP && c % step == 0 && c / step < FP) f[c / step] = _mm512_fmadd_ps(f[c / step], one, zero);
        }
    }
    UNROLLED for (int c = 1; c < 16; c++) acc[0] = _mm512_add_epi32(acc[0], acc[c]);
    UNROLLED for (int c = 0; c < FP; c++) OPAQUE_V(f[c]);
    uint32_t lanes[16];
    _mm512_storeu_si512(lanes, acc[0]);
    uint64_t sum = 0;
    for (int i = 0; i < 16; i++) sum += lanes[i];
    return sum;
}

__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))) static uint64_t
peak_vnni512_mix(int64_t rounds, int fp) {
    switch (fp) {
    case 1: return peak_vnni512_fp(rounds, 1);
    case 2: return peak_vnni512_fp(rounds, 2);
    case 3: return peak_vnni512_fp(rounds, 3);
    case 4: return peak_vnni512_fp(rounds, 4);
    case 5: return peak_vnni512_fp(rounds, 5);
    case 6: return peak_vnni512_fp(rounds, 6);
    case 7: return peak_vnni512_fp(rounds, 7);
    case 8: return peak_vnni512_fp(rounds, 8);
    default: return peak_vnni512_fp(rounds, 0);
    }
}

__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))) static uint64_t
peak_vnni256(int64_t rounds) {
    __m256i acc[CHAINS], u = _mm256_set1_epi8(1), s = _mm256_set1_epi8(1);
    UNROLLED for (int c = 0; c < CHAINS; c++) {
        acc[c] = _mm256_setzero_si256();
        OPAQUE_V(acc[c]);
    }
    for (int64_t r = 0; r < rounds; r++) {
        OPAQUE_V(u);
        UNROLLED for (int c = 0; c < CHAINS; c++) acc[c] = _mm256_dpbusd_epi32(acc[c], u, s);
    }
    UNROLLED for (int c = 1; c < CHAINS; c++) acc[0] = _mm256_add_epi32(acc[0], acc[c]);
    uint32_t lanes[8];
    _mm256_storeu_si256((__m256i *)lanes, acc[0]);
    uint64_t sum = 0;
    for (int i = 0; i < 8; i++) sum += lanes[i];
    return sum;
}

/* As the AVX2 kernels spend a block: per 32 codes a vpmaddubsw and a 16-bit add, and per block
 * of 8 steps one vpmaddwd into 32 bits (with its add). Each product reads its own codes from L1,
 * as a kernel's do (one shared input in a register would be one product, reused; inputs made
 * opaque per product instead were computed ahead and spilled: with 16 vector registers, 2
 * chains keep the loop in registers but for a few spills, 4 spilled each round). */
__attribute__((target("avx2,fma,f16c"))) static uint64_t peak_avx2(int64_t rounds) {
    enum { C = 2 };
    uint8_t codes[8 * C * 32] __attribute__((aligned(32)));
    memset(codes, 1, sizeof codes);
    const uint8_t *in = codes;
    __m256i acc[C], wide[C], s = _mm256_set1_epi8(1), ones = _mm256_set1_epi16(1);
    UNROLLED for (int c = 0; c < C; c++) wide[c] = _mm256_setzero_si256();
    /* CHAINS / C blocks per chain and 8 rounds, so a round does CHAINS products as on the other paths */
    for (int64_t r = 0; r < rounds / 8 * (CHAINS / C); r++) {
        __asm__ volatile("" : "+r"(in)); /* the codes may have changed: every load happens */
        UNROLLED for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_si256();
        UNROLLED for (int st = 0; st < 8; st++)
            UNROLLED for (int c = 0; c < C; c++)
                acc[c] = _mm256_add_epi16(acc[c], _mm256_maddubs_epi16(load32(in + 32 * (st * C + c)), s));
        UNROLLED for (int c = 0; c < C; c++) wide[c] = _mm256_add_epi32(wide[c], _mm256_madd_epi16(acc[c], ones));
    }
    UNROLLED for (int c = 1; c < C; c++) wide[0] = _mm256_add_epi32(wide[0], wide[c]);
    uint32_t lanes[8];
    _mm256_storeu_si256((__m256i *)lanes, wide[0]);
    uint64_t sum = 0;
    for (int i = 0; i < 8; i++) sum += lanes[i];
    return sum;
}

/* The joined 16-bit kernels' instruction alone: vpmaddwd with the 32-bit add that accumulates it
 * (AVX2 has no accumulating form), in register chains with no loads. A round is 24 products, as
 * on the other paths: 3 passes of 8 chains over 4 inputs that are made opaque each pass (so no
 * product can be computed once and reused) times 2 opaque factors; 14 of the 16 registers. Each
 * product of (1, 1) by (1, 1) pairs adds 2 to each of its 8 lanes: 16 multiply-adds. */
__attribute__((target("avx2,fma,f16c"))) static uint64_t peak_avx2_words(int64_t rounds) {
    __m256i acc[8], x[4], s[2];
    UNROLLED for (int c = 0; c < 8; c++) {
        acc[c] = _mm256_setzero_si256();
        OPAQUE(acc[c]);
    }
    UNROLLED for (int i = 0; i < 4; i++) x[i] = _mm256_set1_epi16(1);
    s[0] = s[1] = _mm256_set1_epi16(1);
    OPAQUE(s[0]);
    OPAQUE(s[1]);
    for (int64_t r = 0; r < rounds; r++)
        UNROLLED for (int pass = 0; pass < 3; pass++) {
            UNROLLED for (int i = 0; i < 4; i++) OPAQUE(x[i]);
            UNROLLED for (int c = 0; c < 8; c++) {
                acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(x[c % 4], s[c / 4]));
                __asm__("" : "+x"(acc[c])); /* a chain, as in the kernels: not a tree that spills */
            }
        }
    UNROLLED for (int c = 1; c < 8; c++) acc[0] = _mm256_add_epi32(acc[0], acc[c]);
    uint32_t lanes[8];
    _mm256_storeu_si256((__m256i *)lanes, acc[0]);
    uint64_t sum = 0;
    for (int i = 0; i < 8; i++) sum += lanes[i];
    return sum;
}
#endif

/* Plain C: 32 unsigned-by-signed byte products into 32-bit sums per step, as intdot.c does. */
static uint64_t peak_plain(int64_t rounds) {
    enum { C = 4, W = 32 };
    uint8_t u[W];
    int8_t s[W];
    uint32_t acc[C][W] = {{0}}; /* unsigned: wraps as the SIMD lanes do, where int32 would overflow */
    for (int i = 0; i < W; i++) u[i] = 1, s[i] = 1;
    const uint8_t *up = u;
    for (int64_t r = 0; r < rounds * (CHAINS / C); r++) {
        __asm__ volatile("" : "+r"(up));
        UNROLLED for (int c = 0; c < C; c++)
            for (int i = 0; i < W; i++) acc[c][i] += (uint32_t)((int32_t)up[i] * s[i]);
    }
    uint64_t sum = 0;
    UNROLLED for (int c = 0; c < C; c++)
        for (int i = 0; i < W; i++) sum += acc[c][i];
    return sum;
}

/* Rounds per call of a path's loop: its 32-bit lanes, each the sum of up to 96 products per round
 * once the chains are added, would wrap beyond 44 million rounds (a 0.2 s run of the 512-bit
 * path on two threads), so a long run is counted one segment at a time. */
#define SEGMENT ((int64_t)1 << 20)

/* run_probe's mix for the 16-bit probe */
#define WORDS (-2)

/* One segment of a probe: the path's own loop (mix -1), the 16-bit one (WORDS), or the 512-bit
 * loop with mix float FMAs per 16 of its instructions. */
static uint64_t peak_segment(int path, int mix, int64_t rounds) {
#if QW_HAVE_X86
    if (mix == WORDS) return peak_avx2_words(rounds);
    if (mix >= 0) return peak_vnni512_mix(rounds, mix);
    if (path >= 3) return peak_vnni512(rounds);
    if (path == 2) return peak_vnni256(rounds);
    if (path == 1) return peak_avx2(rounds);
#endif
    (void)path;
    (void)mix;
    return peak_plain(rounds);
}

/* `rounds` (rounded down to a multiple of 8, at least 8) of a probe on every kernel thread at
 * once, one segment at a time. */
static uint64_t run_probe(int path, int mix, int64_t rounds) {
    if (rounds < 8) rounds = 8;
    rounds &= ~(int64_t)7;
    uint64_t total = 0;
#pragma omp parallel num_threads(qw_get_threads()) reduction(+ : total)
    for (int64_t done = 0; done < rounds; done += SEGMENT)
        total += peak_segment(path, mix, rounds - done < SEGMENT ? rounds - done : SEGMENT);
    return total;
}

uint64_t qw_dot_peak(int64_t rounds) { return run_probe(qw_simd_level(), -1, rounds); }

uint64_t qw_dot_peak_words(int64_t rounds) { return qw_simd_level() < 1 ? 0 : run_probe(1, WORDS, rounds); }

uint64_t qw_dot_peak_mix(int64_t rounds, int fp) {
    if (fp < 0 || fp > QW_PEAK_MAX_FP || qw_simd_level() < 3) return 0;
    return run_probe(3, fp, rounds);
}
