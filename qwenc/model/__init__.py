"""The network: weights as the kernels take them, the forward pass, the paged KV cache."""
from .forward import BLOCK_SIZE, KVCache, Sequence, StepItem, Transformer, default_threads
from .weights import Arena, Layer, Linear, Weights, convert_tensor

__all__ = ["BLOCK_SIZE", "KVCache", "Sequence", "StepItem", "Transformer", "default_threads",
           "Arena", "Layer", "Linear", "Weights", "convert_tensor"]
