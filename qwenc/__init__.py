"""qwenc: Qwen2, Qwen2.5 and Qwen3 language models on the CPU."""
from .config import ConfigError, ModelConfig
from .loader import load
from .model import ContextLengthExceeded, Model, Sequence, WeightError
from .sampler import SamplingParams

__version__ = "0.1.0"
__all__ = ["load", "Model", "ModelConfig", "Sequence", "SamplingParams", "ConfigError", "WeightError",
           "ContextLengthExceeded"]
