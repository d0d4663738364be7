"""RoPE's frequencies for a config, float32 as transformers computes them.

Default RoPE turns pair i of a head by position * theta ** (-2i / head_dim). Linear scaling divides
every frequency by the factor. YaRN ("NTK-by-parts") divides only the slow ones: pairs that turn
fewer than `beta_slow` times over the original context are interpolated, those that turn more
than `beta_fast` times are kept, a linear ramp lies between; cos and sin are then scaled by the
attention factor, which sharpens the softmax that the stretched positions flatten. The same
frequencies serve every position and every batch (static scaling, as transformers and vLLM apply
it), so a sequence's logits still do not depend on what else is in the step.
"""
import math

import numpy as np

from ..formats.config import ModelConfig

F32 = np.float32


def rope_frequencies(cfg: ModelConfig) -> tuple:
    """(inv_freq [head_dim / 2] float32, the cos/sin scale)."""
    hd = cfg.head_dim
    exponent = np.arange(0, hd, 2, dtype=np.int64).astype(F32) / F32(hd)
    # theta ** exponent rounded once from double: torch's float32 power is correctly rounded
    # nearly always, numpy's is off by an ulp at a few pairs, an error that grows with position
    pos_freqs = (np.float64(F32(cfg.rope_theta)) ** exponent.astype(np.float64)).astype(F32)
    inv_freq = (F32(1.0) / pos_freqs).astype(F32)
    rs = cfg.rope_scaling
    if rs.kind == "linear":
        return (inv_freq / F32(rs.factor)).astype(F32), 1.0
    if rs.kind != "yarn":
        return inv_freq, 1.0
    low, high = _correction_range(rs.beta_fast, rs.beta_slow, hd, cfg.rope_theta,
                                  rs.original_max_position_embeddings, rs.truncate)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(hd // 2, dtype=F32) - F32(low)) / F32(high - low), F32(0), F32(1)).astype(F32)
    keep = (F32(1) - ramp).astype(F32)  # 1 where a pair keeps its frequency (extrapolation)
    interpolated = (F32(1.0) / (F32(rs.factor) * pos_freqs)).astype(F32)
    inv_freq = (interpolated * (F32(1) - keep) + inv_freq * keep).astype(F32)
    return inv_freq, rs.attention_factor


def _correction_range(beta_fast, beta_slow, dim, base, original, truncate):
    """The pairs between which YaRN's ramp runs: where a pair turns beta_fast and beta_slow times
    over the original context."""
    def pair(turns):
        return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))
    low, high = pair(beta_fast), pair(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)
