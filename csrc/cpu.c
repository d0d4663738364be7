/* syscall() (arch_prctl for the AMX tile state) is declared only with the GNU extensions. */
#define _GNU_SOURCE
#include "cpu.h"

#include <stdlib.h>
#include <string.h>
#if QW_HAVE_X86 && defined(__linux__)
#include <sys/syscall.h>
#endif
#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

/* -1: not decided yet; 0: plain C; 1: AVX2 (+FMA, F16C); 2: AVX2 and AVX-512 (F, BW, VL, VNNI)
 * on 256-bit vectors; 3: as 2, with the integer products of several act rows on 512-bit ones;
 * 4: as 3, with those of 16 act rows on AMX tiles; 5: as 4, 16-bit rows on bf16 tiles where the
 * stored type allows */
static int simd_level = -1;

int qw_cpu_has_avx2(void) {
#if QW_HAVE_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

int qw_cpu_has_avx512(void) {
#if QW_HAVE_X86
    __builtin_cpu_init();
    return qw_cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
    return 0;
#endif
}

/* AMX-INT8 on the CPU, and the tile state granted by the kernel: Linux hands a process the
 * 8 KiB of tile registers only when asked (arch_prctl ARCH_REQ_XCOMP_PERM); without it the first
 * tile instruction faults. Asked once; a refusal leaves the AMX path out. intdot_amx.c is
 * compiled for AVX-512 VBMI too (its bf16 lookups), which every CPU with AMX has. */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
static int amx_state = -1;

int qw_cpu_has_amx(void) {
#if QW_HAVE_X86 && defined(__linux__)
    int s = __atomic_load_n(&amx_state, __ATOMIC_ACQUIRE);
    if (s < 0) {
        __builtin_cpu_init();
        s = qw_cpu_has_avx512() && __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("amx-tile") &&
            __builtin_cpu_supports("amx-int8") &&
            syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
        __atomic_store_n(&amx_state, s, __ATOMIC_RELEASE);
    }
    return s;
#else
    return 0;
#endif
}

/* AMX-BF16 beside AMX-INT8 (the tile state is the same). */
int qw_cpu_has_amx_bf16(void) {
#if QW_HAVE_X86
    return qw_cpu_has_amx() && __builtin_cpu_supports("amx-bf16");
#else
    return 0;
#endif
}

/* The L2 cache of one core in bytes as the OS reports it, or 0 where it does not say. */
size_t qw_cpu_l2_bytes(void) {
#ifdef _SC_LEVEL2_CACHE_SIZE
    long b = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return b > 0 ? (size_t)b : 0;
#else
    return 0;
#endif
}

/* The highest path this CPU can run. */
static int best_level(void) {
    return qw_cpu_has_amx_bf16() ? 5 : qw_cpu_has_amx() ? 4 : qw_cpu_has_avx512() ? 3 : qw_cpu_has_avx2() ? 1 : 0;
}

/* The path taken unless told otherwise: the best this CPU has. The pair kernels (512-bit
 * vpdpbusd on two act rows) pay on Zen 4 too, which runs a 512-bit operation as two 256-bit
 * ones: there they prefilled 1.36-1.38x faster than the 256-bit kernels (1.5B and 0.5B, 512
 * tokens, int16; 1.28x at int8) and batched decode of 16 rows 1.2-1.4x; decode (one act row)
 * takes the 256-bit loop on both paths. */
static int default_level(void) { return best_level(); }

static int level(void) {
    if (simd_level < 0) {
        const char *env = getenv("QWENC_SIMD");
        int best = best_level();
        if (env && strcmp(env, "0") == 0)
            simd_level = 0;
        else if (env && strcmp(env, "avx2") == 0)
            simd_level = best < 1 ? best : 1;
        else if (env && strcmp(env, "avx512") == 0)
            simd_level = best < 2 ? best : 2;
        else if (env && strcmp(env, "avx512w") == 0)
            simd_level = best < 3 ? best : 3;
        else if (env && strcmp(env, "amx") == 0)
            simd_level = best < 4 ? best : 4;
        else if (env && strcmp(env, "amxbf16") == 0)
            simd_level = best;
        else
            simd_level = default_level();
    }
    return simd_level;
}

int qw_use_avx2(void) { return level() >= 1; }

int qw_use_avx512(void) { return level() >= 2; }

int qw_use_avx512w(void) { return level() >= 3; }

int qw_use_amx(void) { return level() >= 4; }

int qw_use_amx_bf16(void) { return level() >= 5; }

int qw_simd_level(void) { return level(); }

int qw_cpu_simd_level(void) { return best_level(); }

int qw_default_simd_level(void) { return default_level(); }

int qw_set_simd_level(int lv) {
    int prev = level(), best = best_level();
    simd_level = lv < 0 ? 0 : lv > best ? best : lv;
    return prev;
}

int qw_set_simd(int enabled) { return qw_set_simd_level(enabled ? default_level() : 0) >= 1; }

/* The kernels' thread count. A global, not OpenMP's per-thread setting: the setting made by
 * the thread that loads a model must hold in whichever thread later runs its steps (an engine's
 * loop, a server's worker), and each parallel region asks for it with num_threads(). */
static int n_threads = 0;

int qw_get_threads(void) {
#ifdef _OPENMP
    int n = __atomic_load_n(&n_threads, __ATOMIC_RELAXED);
    return n > 0 ? n : omp_get_max_threads();
#else
    return 1;
#endif
}

void qw_set_threads(int n) {
#ifdef _OPENMP
    if (n > 0) __atomic_store_n(&n_threads, n, __ATOMIC_RELAXED);
#else
    (void)n;
#endif
}

int qw_parallel_width(void) {
    int n = 1;
#pragma omp parallel num_threads(qw_get_threads())
    {
#ifdef _OPENMP
#pragma omp single
        n = omp_get_num_threads();
#endif
    }
    return n;
}

/* Allocations a test asked to fail. */
static int fail_allocs = 0;

void qw_fail_allocs(int n) { __atomic_store_n(&fail_allocs, n > 0 ? n : 0, __ATOMIC_RELAXED); }

void *qw_alloc(size_t size) {
    int n = __atomic_load_n(&fail_allocs, __ATOMIC_RELAXED);
    while (n > 0) {
        if (__atomic_compare_exchange_n(&fail_allocs, &n, n - 1, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return NULL;
    }
    return aligned_alloc(64, (size + 63) & ~(size_t)63);
}

void qw_free(void *p) { free(p); }
