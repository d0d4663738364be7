/* Instruction rates behind the 512-bit pair kernels (csrc/intdot_avx512.c), on one core.
 *
 *     cc -O2 -o /tmp/vnni_rates bench/vnni_rates.c && /tmp/vnni_rates
 *
 * Each line runs 512-bit vpdpbusd in 12 independent chains (enough to cover its latency), with
 * one other instruction per vpdpbusd beside it, or with its act operand from memory, and prints
 * G vpdpbusd a second. Against the first line: an instruction that leaves the rate alone runs on
 * other pipes; one that halves it takes the vpdpbusd pipes one for one (the float multiplies and
 * FMAs of the kernels' scaling); two broadcast loads per vpdpbusd show what the loads allow.
 * Needs an AVX-512 VNNI CPU (checked at run time). */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define N 200000000L
#define R12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define TARGET __attribute__((target("avx512f,avx512bw,avx512vnni")))

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static char mem[4096] __attribute__((aligned(64)));

#define DECL(i) __m512i a##i = _mm512_set1_epi32(i), d##i = _mm512_set1_epi32(i + 1);
#define KEEP(i) __asm__ volatile("" : "+v"(a##i), "+v"(d##i));
#define SUM(i) s += _mm512_reduce_add_epi32(a##i) + _mm512_reduce_add_epi32(d##i);
/* 8 bytes at pm + off broadcast by a load (the memory form, as the kernels' broadcasts compile to;
 * from C the compiler may load into a general register and broadcast from there instead) */
#define BQ(v, off) __asm__("vpbroadcastq %c1(%2), %0" : "=v"(v) : "i"(off), "r"(pm))
/* the loop body per chain i; pm is the memory base, opaque to the compiler each iteration */
#define B_ALONE(i) a##i = _mm512_dpbusd_epi32(a##i, b, c);
#define B_WSSD(i) a##i = _mm512_dpwssd_epi32(a##i, b, c);
#define B_SHIFT(i) B_ALONE(i) d##i = _mm512_slli_epi32(d##i, 1);
#define B_ADD(i) B_ALONE(i) d##i = _mm512_add_epi32(d##i, b);
#define B_CVT(i) B_ALONE(i) d##i = _mm512_castps_si512(_mm512_cvtepi32_ps(d##i));
#define B_PERM(i) B_ALONE(i) d##i = _mm512_permutexvar_epi32(b, d##i);
#define B_FMA(i)                                                                                         \
    B_ALONE(i) d##i = _mm512_castps_si512(_mm512_fmadd_ps(_mm512_castsi512_ps(d##i), _mm512_castsi512_ps(b), \
                                                          _mm512_castsi512_ps(c)));
#define B_BCAST(i)                                                                                       \
    {                                                                                                    \
        __m512i x;                                                                                       \
        BQ(x, 8 * i);                                                                                    \
        a##i = _mm512_dpbusd_epi32(a##i, b, x);                                                          \
    }
#define B_BCAST2(i) B_BCAST(i) BQ(d##i, 8 * i + 512);
#define B_EMBED(i) __asm__("vpdpbusd %c2(%1)%{1to16%}, %3, %0" : "+v"(a##i) : "r"(pm), "i"(4 * i), "v"(b));

#define TEST(name, BODY)                                                                                 \
    t = now();                                                                                           \
    for (long n = 0; n < N / 12; n++) {                                                                  \
        const char *pm = mem;                                                                            \
        __asm__ volatile("" : "+r"(pm));                                                                 \
        (void)pm;                                                                                        \
        R12(BODY) R12(KEEP)                                                                              \
    }                                                                                                    \
    printf("%-44s %6.2f\n", name, (double)N / (now() - t) / 1e9);

TARGET static int run(void) {
    R12(DECL)
    const __m512i b = _mm512_set1_epi32(3), c = _mm512_set1_epi32(5);
    double t;
    printf("%-44s %6s\n", "one core, 12 chains", "G vpdpbusd/s");
    TEST("vpdpbusd alone", B_ALONE)
    TEST("vpdpwssd alone (its rate, 16-bit pairs)", B_WSSD)
    TEST("+ vpslld each", B_SHIFT)
    TEST("+ vpaddd each", B_ADD)
    TEST("+ vcvtdq2ps each", B_CVT)
    TEST("+ vpermd each", B_PERM)
    TEST("+ vfmadd231ps each", B_FMA)
    TEST("act operand a 64-bit broadcast load", B_BCAST)
    TEST("... and a second broadcast load each", B_BCAST2)
    TEST("act operand an embedded {1to16} broadcast", B_EMBED)
    int s = 0;
    R12(SUM)
    return s;
}

int main(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512vnni")) {
        fprintf(stderr, "this CPU has no AVX-512 VNNI\n");
        return 1;
    }
    for (int i = 0; i < (int)sizeof mem; i++) mem[i] = (char)(7 * i);
    return run() == 7; /* the sums are kept so that nothing is optimised away */
}
