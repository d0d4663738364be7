"""`qwenc.load(path)`: from a model on disk to a ready Model.

Accepted paths: a HuggingFace model directory (config.json + safetensors), a .gguf file, or a hub
repo id ("Qwen/Qwen2.5-0.5B-Instruct") already present in the local HuggingFace cache.
"""
import os
from pathlib import Path

import numpy as np

from .chat_template import ChatTemplate
from .config import config_from_dict, load_config
from .generation_config import load_generation_defaults
from .model import Model, Weights
from .safetensors_io import read_checkpoint
from .tensors import BF16, F32, Q8_0, Tensor

DTYPES = (None, "f32", "bf16", "q8_0")


def resolve_model_path(spec) -> Path:
    """A local path for `spec`, looking in the HuggingFace hub cache for repo ids."""
    path = Path(os.path.expanduser(str(spec)))
    if path.exists():
        return path
    if "/" in str(spec) and not str(spec).startswith((".", "/")):
        hub = Path(os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or
                   Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub")
        repo = hub / ("models--" + str(spec).replace("/", "--"))
        ref = repo / "refs" / "main"
        snapshots = repo / "snapshots"
        if ref.is_file() and (snapshots / ref.read_text().strip()).is_dir():
            return snapshots / ref.read_text().strip()
        if snapshots.is_dir():
            found = sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime)
            if found:
                return found[-1]
        raise FileNotFoundError(f"model '{spec}' is neither a local path nor in the HuggingFace cache ({hub})")
    raise FileNotFoundError(f"model path '{spec}' does not exist")


# ---------------------------------------------------------------- weight type conversion

def _f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    bits = x.astype(np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))  # round to nearest even
    return (rounded >> 16).astype(np.uint16)


def convert_tensor(t: Tensor, dtype: str) -> Tensor:
    """t re-encoded as `dtype` (a new in-memory copy), or t itself when nothing changes."""
    target = {"f32": F32, "bf16": BF16, "q8_0": Q8_0}[dtype]
    if t.dtype == target:
        return t
    rows, cols = t.shape
    out = []
    step = max(1, (1 << 22) // cols)  # convert in slices: never a float copy of the whole matrix
    row_size = None
    for r0 in range(0, rows, step):
        part = Tensor(t.name, t.dtype, (min(step, rows - r0), cols), _row_slice(t, r0, step), t.source)
        x = part.to_f32()
        if target == F32:
            enc = x.view(np.uint8).reshape(-1)
        elif target == BF16:
            enc = _f32_to_bf16_bits(x).view(np.uint8).reshape(-1)
        else:
            if cols % 32:
                raise ValueError(f"{t.name}: {cols} columns are not a multiple of 32; cannot use q8_0")
            from . import _quant
            enc = np.asarray(_quant.quantize_q8_0(np.ascontiguousarray(x))).reshape(-1)
        out.append(enc)
        row_size = enc.size // x.shape[0]
    data = np.concatenate(out) if len(out) > 1 else out[0]
    assert data.size == row_size * rows
    return Tensor(t.name, target, t.shape, np.ascontiguousarray(data), t.source)


def _row_slice(t: Tensor, r0: int, n: int) -> np.ndarray:
    from .tensors import row_bytes
    rb = row_bytes(t.dtype, t.shape[1])
    return t.data[r0 * rb:(r0 + n) * rb]


# ---------------------------------------------------------------- model directories

def _hf_parts(model_dir: Path):
    cfg = load_config(model_dir)
    tensors = read_checkpoint(model_dir)
    tokenizer = None
    if (model_dir / "tokenizer.json").is_file():
        from .tokenizer import Tokenizer
        tokenizer = Tokenizer.from_dir(model_dir)
    gen = load_generation_defaults(model_dir)
    template = ChatTemplate.from_model_dir(model_dir) if tokenizer is not None else None
    return cfg, tensors, tokenizer, gen, template


def _gguf_parts(path: Path):
    from .gguf import gguf_to_hf, open_gguf
    gf = open_gguf(path)
    cfg_dict, tensors = gguf_to_hf(gf)
    cfg = config_from_dict(cfg_dict, str(path))
    from .tokenizer import Tokenizer
    tokenizer = Tokenizer.from_gguf_metadata(gf.metadata) if "tokenizer.ggml.tokens" in gf.metadata else None
    template = ChatTemplate.from_gguf_metadata(gf.metadata)
    return cfg, tensors, tokenizer, {}, template


def load(path, dtype: str = None, threads: int = None, context: int = 4096, activations: str = "f32") -> Model:
    """Load a Qwen2/Qwen2.5/Qwen3 model.

    path:    model directory, .gguf file, or a hub repo id present in the local HF cache
    dtype:   None keeps weights as stored (BF16/F16/F32 or GGUF blocks, memory-mapped);
             "f32", "bf16" or "q8_0" re-encode the weight matrices in memory at load
    threads: kernel threads (default: $QWENC_THREADS, else the CPUs this process may use)
    context: KV cache capacity of each sequence, in tokens
    activations: decode's arithmetic on block-quantized (GGUF, q8_0) weights. "f32" (default)
             multiplies them by float32 activations: what transformers computes on the
             dequantized model, token for token. "int16" rounds each activation row to 16-bit
             codes for integer dot products (faster; logits within ~1e-3 of f32), "int8" to
             8-bit codes (fastest; an occasional near-tie between two tokens flips)
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    p = resolve_model_path(path)
    if p.is_dir():
        cfg, tensors, tokenizer, gen, template = _hf_parts(p)
    elif _is_gguf(p):
        cfg, tensors, tokenizer, gen, template = _gguf_parts(p)
    else:
        raise ValueError(f"{p}: not a model directory or a GGUF file")
    if tokenizer is not None:
        tokenizer.chat_template = template
    convert = (lambda t: convert_tensor(t, dtype)) if dtype else None
    weights = Weights(cfg, tensors, convert)
    return Model(cfg, weights, tokenizer=tokenizer, context=context, threads=threads,
                 generation_defaults=gen, chat_template=template, source=str(p),
                 activations=activations)


def _is_gguf(p: Path) -> bool:
    with open(p, "rb") as f:
        return f.read(4) == b"GGUF"
