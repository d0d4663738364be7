"""qwenc: Qwen2, Qwen2.5 and Qwen3 language models on the CPU.

Layers, each importing only the ones below it:
  _ops, _quant, _bpe   C kernels (csrc/) behind thin Cython faces
  formats/             model files: safetensors, GGUF, config.json; where a model name leads
  text/                tokenizer, chat templates, streamed detokenization with stop strings
  model/               the network: weights, the forward pass, the paged KV cache
  engine/              sampling, one-sequence generation, the batching engine
  llm.py, loader.py    Model (what load returns) and load()
  server/, cli.py      the OpenAI-compatible HTTP server and the command line
"""
from .engine.engine import Completion, Engine, Output, RequestStream
from .engine.generate import ChatSession, Generation
from .engine.sampling import SamplingParams
from .errors import (ChatTemplateError, ConfigError, ContextLengthExceeded, GGUFError, InvalidRequest,
                     ModelFormatError, ModelNotFound, QueueFull, QwencError, WeightError)
from .formats.config import ModelConfig
from .llm import Model
from .loader import load
from .model import Sequence

__version__ = "0.1.0"
__all__ = ["load", "Model", "Engine", "RequestStream", "Output", "Completion", "ModelConfig", "Sequence", "SamplingParams", "Generation", "ChatSession",
           "QwencError", "ModelFormatError", "ConfigError", "WeightError", "GGUFError", "ChatTemplateError",
           "ModelNotFound", "InvalidRequest", "ContextLengthExceeded", "QueueFull"]
