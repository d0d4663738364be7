/* Run-time CPU dispatch: which SIMD path the kernels take.
 *
 * Kernels are compiled twice where it pays: a plain C path and an AVX2+FMA+F16C path marked with
 * QW_TARGET_AVX2 (a per-function target attribute, so the wheel carries no -march flag). Each
 * kernel asks qw_use_avx2() once per call and picks one; the integer products also have an
 * AVX-512 VNNI path (qw_use_avx512()). QWENC_SIMD=0 in the environment, or qw_set_simd(0),
 * forces the plain path everywhere; the tests use that to keep it honest.
 */
#ifndef QWENC_CPU_H
#define QWENC_CPU_H

#include <stddef.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define QW_HAVE_X86 1
#define QW_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define QW_TARGET_AVX512F __attribute__((target("avx2,fma,f16c,avx512f")))
#else
#define QW_HAVE_X86 0
#define QW_TARGET_AVX2
#define QW_TARGET_AVX512F
#endif

/* 1 when the AVX2 path is both supported by this CPU and enabled. */
int qw_use_avx2(void);
/* 1 when, beside AVX2, the AVX-512 integer products (F, BW, VL and VNNI) are supported and
 * enabled (QWENC_SIMD=avx2 keeps them off). */
int qw_use_avx512(void);
/* 1 when the AVX-512 integer products take act rows in pairs in 512-bit vectors (the default on
 * Intel; QWENC_SIMD=avx512 keeps them on 256-bit vectors, QWENC_SIMD=avx512w asks for them). */
int qw_use_avx512w(void);
/* 1 when, beside those, the integer products of 16 act rows go on AMX tiles (the default where
 * the CPU has AMX-INT8 and the kernel grants the tile state; QWENC_SIMD=avx512w keeps them off). */
int qw_use_amx(void);
/* 1 when, beside those, the products of 16-bit act rows go on bf16 tiles where the stored type
 * allows (the default where the CPU also has AMX-BF16; QWENC_SIMD=amx keeps them on int8 tiles). */
int qw_use_amx_bf16(void);
int qw_cpu_has_avx512(void);
/* 1 when this CPU has AMX-INT8 and the kernel granted this process the tile state. */
int qw_cpu_has_amx(void);
/* 1 when it also has AMX-BF16. */
int qw_cpu_has_amx_bf16(void);
/* The L2 cache of one core in bytes as the OS reports it (sysconf), or 0 where it does not say. */
size_t qw_cpu_l2_bytes(void);
/* 1 when this CPU supports AVX2, FMA and F16C (whatever the setting). */
int qw_cpu_has_avx2(void);
/* Enable (1) or disable (0) SIMD paths; returns the previous setting. */
int qw_set_simd(int enabled);
/* The path the kernels take (0 plain C, 1 AVX2, 2 AVX2 + AVX-512 integer products on 256-bit
 * vectors, 3 the same with several act rows' products on 512-bit ones, 4 as 3 with AMX tiles for
 * 16 act rows at a time, 5 as 4 with 16-bit rows on bf16 tiles), the highest one this CPU can run, the one it takes by default, and a setting of it (clamped to what the CPU has; returns
 * the previous level), so that the tests run every path a machine has. */
int qw_simd_level(void);
int qw_cpu_simd_level(void);
int qw_default_simd_level(void);
int qw_set_simd_level(int level);

/* Threads used by the OpenMP kernels (1 when built without OpenMP). */
int qw_get_threads(void);
void qw_set_threads(int n);
/* Threads a parallel region of the kernels gets when started from the calling thread. */
int qw_parallel_width(void);

/* 64-byte aligned buffers for the kernels' scratch; qw_alloc returns NULL when out of memory.
 * qw_fail_allocs(n) makes the next n calls fail (for tests of the error paths; 0 turns it off). */
void *qw_alloc(size_t size);
void qw_free(void *p);
void qw_fail_allocs(int n);

#endif
