/* The machine's yardsticks: memory read bandwidth and the integer products' instruction rate. */
#ifndef QWENC_PROBE_H
#define QWENC_PROBE_H

#include <stdint.h>

/* The wrapping sum of the n / 8 little 64-bit words at p (n a multiple of 8), read by all the
 * kernels' threads in contiguous shares: a plain streaming read, the bandwidth probe's yardstick
 * for what decode could reach (the sum only keeps the reads from being optimised away). */
uint64_t qw_read_sum(const uint64_t *p, int64_t n_words);

/* The integer kernels' byte multiply-add instruction of the current path (512-bit vpdpbusd,
 * 256-bit vpdpbusd, AVX2's vpmaddubsw with its 16-bit add and per-block vpmaddwd, or plain C's
 * byte products), `rounds` rounds (rounded down to a multiple of 8, at least 8) of independent
 * chains on every kernel thread at once, all inputs 1. Returns the number of byte
 * multiply-adds done (each adds 1 to the lanes' sum, which is what is returned); `qwenc bench`
 * times it for the peak rate a prefill's integer products could reach. */
uint64_t qw_dot_peak(int64_t rounds);

/* The 512-bit vpdpbusd probe in rounds of 16 chains (1,024 byte multiply-adds) with fp
 * (0..QW_PEAK_MAX_FP) 512-bit float FMAs among each round's 16 instructions, as the pair kernels
 * mix them: the integer rate it reaches is the ceiling of a kernel doing that much float work per
 * product. Returns the byte multiply-adds done, or 0 where the path is not the 512-bit one (or fp
 * is out of range). */
#define QW_PEAK_MAX_FP 8
uint64_t qw_dot_peak_mix(int64_t rounds, int fp);

/* AVX2's vpmaddwd (with the 32-bit add that accumulates it), 24 products a round in register
 * chains on every kernel thread, all inputs 1: the instruction of the joined 16-bit kernels
 * (intdot_avx2.c) alone, with none of their loads. Returns the 16-bit multiply-adds done (16 a
 * product), or 0 where the path has no AVX2. */
uint64_t qw_dot_peak_words(int64_t rounds);

#endif
