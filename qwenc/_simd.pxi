# Included by _ops.pyx and _quant.pyx, each of which declares qw_simd_level, qw_cpu_simd_level,
# qw_default_simd_level and qw_set_simd_level from cpu.h.
SIMD_PATHS = ("plain", "avx2", "avx512", "avx512w", "amx", "amxbf16")


def simd_paths():
    """The kernel paths this CPU can take, plain first: a subset of SIMD_PATHS."""
    return list(SIMD_PATHS[:qw_cpu_simd_level() + 1])


def simd_path():
    """The path the kernels take now: "plain", "avx2", "avx512" (AVX2 with the AVX-512 VNNI
    integer products on 256-bit vectors), "avx512w" (those of several act rows on 512-bit
    vectors, two rows per vector), "amx" (as avx512w, with 16 act rows at a time on AMX tiles) or
    "amxbf16" (as amx, 16-bit act rows on bf16 tiles where the stored type allows)."""
    return SIMD_PATHS[qw_simd_level()]


def default_simd_path():
    """The path this CPU takes unless told otherwise (on AVX-512 CPUs: "amxbf16" on Intel's with
    AMX-BF16, "amx" on those with AMX-INT8 alone, "avx512w" on the others)."""
    return SIMD_PATHS[qw_default_simd_level()]


def set_simd_path(path):
    """Take `path` (one of simd_paths()); returns the previous one."""
    if path not in SIMD_PATHS:
        raise ValueError(f"unknown SIMD path {path!r}; expected one of {SIMD_PATHS}")
    lv = SIMD_PATHS.index(path)
    if lv > qw_cpu_simd_level():
        raise ValueError(f"this CPU cannot take the {path} path (it has {simd_paths()})")
    return SIMD_PATHS[qw_set_simd_level(lv)]
