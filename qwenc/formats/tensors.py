"""A weight tensor as stored on disk: type code, shape, and its raw bytes (a view into an mmap).

Both file formats (safetensors, GGUF) produce these, named and shaped the HuggingFace way
("model.layers.0.self_attn.q_proj.weight", shape [out_features, in_features]), so the model code
never knows which format it came from. `data` is never copied at load: the kernels read it in place.
"""
from dataclasses import dataclass

import numpy as np

# GGML type codes (csrc/quant.h): the kernels dispatch on these.
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 3, 6, 7, 8, 12, 13, 14, 30

DTYPE_NAMES = {F32: "F32", F16: "F16", BF16: "BF16", Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0",
               Q5_1: "Q5_1", Q8_0: "Q8_0", Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K"}

# (elements per block, bytes per block)
BLOCK = {F32: (1, 4), F16: (1, 2), BF16: (1, 2), Q4_0: (32, 18), Q4_1: (32, 20), Q5_0: (32, 22),
         Q5_1: (32, 24), Q8_0: (32, 34), Q4_K: (256, 144), Q5_K: (256, 176), Q6_K: (256, 210)}


def row_bytes(dtype: int, n: int) -> int:
    elems, nbytes = BLOCK[dtype]
    return (n // elems) * nbytes


@dataclass
class Tensor:
    name: str
    dtype: int            # GGML type code
    shape: tuple          # HF order: (rows, cols) for matrices, (n,) for vectors
    data: np.ndarray      # uint8 view of the stored bytes, C-contiguous, not copied
    source: str = ""      # file it came from, for error messages

    @property
    def dtype_name(self) -> str:
        return DTYPE_NAMES.get(self.dtype, str(self.dtype))

    def to_f32(self) -> np.ndarray:
        """A float32 copy (for small tensors: norms, biases)."""
        if self.dtype == F32:
            return self.data.view(np.float32).reshape(self.shape).copy()
        if self.dtype == F16:
            return self.data.view(np.float16).astype(np.float32).reshape(self.shape)
        if self.dtype == BF16:
            return (self.data.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(self.shape)
        from .. import _quant
        rows = self.shape[0] if len(self.shape) == 2 else 1
        cols = self.shape[-1]
        return _quant.dequantize(self.data, self.dtype, rows, cols).reshape(self.shape)
