"""Build the C kernels (csrc/) and their Cython wrappers (qwenc/_*.pyx).

SIMD is chosen at run time (csrc/cpu.c), so no -march flag is passed here: the same wheel runs on
any x86-64 and falls back to plain C where AVX2/FMA are missing. OpenMP is used when the compiler
accepts it; without it the kernels run on one thread.

QWENC_SANITIZE=address,undefined builds the C code with those sanitizers (and without
optimizations that hide where a fault is), for `make test-asan`; that build goes to a directory
of its own (setup.py build --build-base ...), never over the in-place one.
"""
import glob
import os
import subprocess
import sys
import tempfile

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

# The weight types and the matrix products: block formats and their plain reference (quant.c),
# their AVX2 dequantizers, the integer path's activation rows, its repacked layouts with their
# plain, AVX2 and AVX-512 VNNI products, the float dot, and the products' driver.
KERNELS = ["csrc/cpu.c", "csrc/quant.c", "csrc/quant_avx2.c", "csrc/act.c", "csrc/act_avx512.c", "csrc/intdot.c",
           "csrc/intdot_avx2.c", "csrc/intdot_avx512.c", "csrc/intdot_amx.c", "csrc/fdot.c", "csrc/ops.c", "csrc/matmul.c"]

# Each Python-visible module and the C files it wraps.
MODULES = {
    "qwenc._ops": KERNELS + ["csrc/probe.c", "csrc/attention.c", "csrc/forward.c", "csrc/moe.c", "csrc/sample.c"],
    "qwenc._quant": KERNELS,
    "qwenc._bpe": ["csrc/bpe.c"],
}


def compiler_accepts(flag):
    """True when the C compiler builds and links a small OpenMP program with `flag`."""
    cc = os.environ.get("CC", "cc")
    src = "#include <omp.h>\nint main(void){return omp_get_max_threads() > 0 ? 0 : 1;}\n"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "t.c")
        with open(path, "w") as f:
            f.write(src)
        try:
            res = subprocess.run([cc, flag, path, "-o", os.path.join(tmp, "t")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError:
            return False
        return res.returncode == 0


def extensions():
    use_openmp = os.environ.get("QWENC_NO_OPENMP") != "1" and sys.platform != "win32" and compiler_accepts("-fopenmp")
    # -ffp-contract=off: the compiler must not fuse a multiply and an add on its own; the kernels'
    # reduction orders (csrc/fdot.h, matmul.h) are part of their results, the same whatever the
    # compiler's default.
    cflags = ["-O3", "-std=c11", "-Wall", "-Wextra", "-fno-math-errno", "-ffp-contract=off",
              "-DNPY_NO_DEPRECATED_API=NPY_1_7_API_VERSION"]
    ldflags = []
    sanitize = os.environ.get("QWENC_SANITIZE", "")
    if sanitize:
        # The shipped -O3 (some AVX2 helpers take immediates through inlined, unrolled arguments,
        # which fold to constants only then), plus what a report needs to point at its line.
        # UB aborts (no recovery), so a report cannot scroll by in a passing run.
        cflags = ["-O3", "-g", "-fno-omit-frame-pointer", f"-fsanitize={sanitize}"] + cflags[1:]
        if "undefined" in sanitize:
            cflags.append("-fno-sanitize-recover=undefined")
        ldflags.append(f"-fsanitize={sanitize}")
    if use_openmp:
        cflags.append("-fopenmp")
        ldflags.append("-fopenmp")
    else:  # the omp pragmas are then simply serial loops
        cflags.append("-Wno-unknown-pragmas")
    # QWENC_BUILD_ONLY=qwenc._bpe,... builds a subset (handy while working on one kernel family).
    only = [m for m in os.environ.get("QWENC_BUILD_ONLY", "").split(",") if m]
    exts = []
    for name, sources in MODULES.items():
        if only and name not in only:
            continue
        pyx = name.replace(".", "/") + ".pyx"
        # depends: a header's change rebuilds every module (the kernel files share intdot_x86.h)
        exts.append(Extension(name, [pyx] + sources, include_dirs=["csrc", np.get_include()],
                              depends=sorted(glob.glob("csrc/*.h")),
                              extra_compile_args=cflags, extra_link_args=ldflags))
    return cythonize(exts, compiler_directives={"language_level": 3, "boundscheck": False,
                                                "wraparound": False, "cdivision": True},
                     quiet=True)


setup(ext_modules=extensions())
