"""`qwenc.load(path)`: from a model on disk to a ready Model.

Accepted names: a HuggingFace model directory (config.json + safetensors), a .gguf file (the first
part of a split one), a demo name ("demo", "demo-1.5b"), or a hub id ("Qwen/Qwen2.5-0.5B-Instruct",
"Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q4_K_M", "OWNER/REPO/FILE.gguf", each with "@REVISION"),
downloaded into the HuggingFace cache when missing (qwenc.formats.resolve and .hub).
"""
from pathlib import Path

from .errors import ConfigError, InvalidRequest, ModelFormatError
from .formats.config import config_from_dict, load_config, with_rope_scaling
from .formats.generation_config import load_generation_defaults
from .formats.resolve import resolve_model_path
from .formats.safetensors import read_checkpoint
from .llm import Model
from .model import Arena, Weights, convert_tensor
from .text.chat_template import ChatTemplate

DTYPES = (None, "f32", "bf16", "q8_0")


# ---------------------------------------------------------------- model directories

def _hf_parts(model_dir: Path):
    cfg = load_config(model_dir)
    tensors = read_checkpoint(model_dir)
    tokenizer = None
    if (model_dir / "tokenizer.json").is_file():
        from .text.tokenizer import Tokenizer
        tokenizer = Tokenizer.from_dir(model_dir)
    gen = load_generation_defaults(model_dir)
    template = ChatTemplate.from_model_dir(model_dir) if tokenizer is not None else None
    return cfg, tensors, tokenizer, gen, template


def _gguf_parts(path: Path):
    from .formats.gguf import gguf_to_hf, open_gguf
    gf = open_gguf(path)
    cfg_dict, tensors = gguf_to_hf(gf)
    cfg = config_from_dict(cfg_dict, str(path))
    from .text.tokenizer import Tokenizer
    tokenizer = None
    if "tokenizer.ggml.tokens" in gf.metadata:
        tokenizer = Tokenizer.from_gguf_metadata(gf.metadata, source=f"{path} (tokenizer metadata)")
    template = ChatTemplate.from_gguf_metadata(gf.metadata, origin=f"{path} (tokenizer.chat_template)")
    gen = {}
    # A GGUF keeps one end token (<|im_end|> for Qwen's chat models); their generation_config.json
    # ends generation at <|endoftext|> too, as llama.cpp does. The demo model writes it after a
    # tool call, and without it as an end went on past it in text.
    end_of_text = tokenizer.token_to_id("<|endoftext|>") if tokenizer is not None else None
    if end_of_text is not None:
        gen["eos_token_id"] = [end_of_text]
    return cfg, tensors, tokenizer, gen, template


# The arithmetic on block-quantized weights when none is asked for (the CLI uses it too).
DEFAULT_ACTIVATIONS = "int16"


def load(path, dtype: str = None, threads: int = None, context: int = 4096,
         activations: str = DEFAULT_ACTIVATIONS, kv_cache: str = "auto", rope_scaling: dict = None) -> Model:
    """Load a Qwen2/Qwen2.5/Qwen3 model.

    path:    model directory, .gguf file, demo name, or hub id (OWNER/REPO[:QUANT][@REV],
             OWNER/REPO/FILE.gguf), downloaded into the HF cache when missing
    dtype:   None keeps weights as stored (BF16/F16/F32 or GGUF blocks, memory-mapped);
             "f32", "bf16" or "q8_0" re-encode the weight matrices in memory at load
    threads: kernel threads (default: $QWENC_THREADS, else the CPUs this process may use)
    context: KV cache capacity of each sequence, in tokens
    activations: the arithmetic on block-quantized (GGUF, q8_0) weights, prefill and decode
             alike. "int16" (default) rounds each activation row to 16-bit codes per 32 values
             for integer dot products on repacked weights: against transformers' float32 model
             of the demo and 1.5B GGUFs, 100% top-1 agreement and mean KL below 1e-8 nats with
             a float32 KV cache; 99.95-100% and ~1e-6 with the float16 cache "auto" gives it.
             "f32" multiplies the weights by float32 activations: what transformers computes
             on the dequantized model, to float rounding (faster prefill, slower decode).
             "int8" rounds to 8-bit codes (fastest; an occasional near-tie between two tokens
             flips). Float weights (BF16/F16/F32) always run in float32.
    kv_cache: how keys and values are stored: "f32", "f16" (IEEE half: half the memory and
             half the bytes a long context reads per token), or "auto" (default): "f16" where
             an integer activation mode runs on block-quantized weights, "f32" in the exact
             mode and for float weights. Attention computes in float32 either way.
    rope_scaling: RoPE scaling in place of what the model's files say, as config.json's
             `rope_scaling` writes it: {"type": "yarn", "factor": 4.0,
             "original_max_position_embeddings": 32768} reads Qwen2.5 past 32,768 tokens
             (a GGUF converted without it has no other way to say so); {} turns it off.
    """
    if dtype not in DTYPES:
        raise InvalidRequest(f"dtype must be one of {DTYPES}, got {dtype!r}")
    p = resolve_model_path(path)
    if p.is_dir():
        cfg, tensors, tokenizer, gen, template = _hf_parts(p)
    elif _is_gguf(p):
        cfg, tensors, tokenizer, gen, template = _gguf_parts(p)
    else:
        raise ModelFormatError(f"{p}: not a model directory or a GGUF file")
    if rope_scaling is not None:
        try:
            cfg = with_rope_scaling(cfg, rope_scaling)
        except ConfigError as exc:
            raise InvalidRequest(str(exc)) from None
    if tokenizer is not None:
        # Every id the tokenizer can produce must have an embedding row: one past them would be
        # refused by the first forward pass instead of here.
        if tokenizer.id_count > cfg.vocab_size:
            raise ModelFormatError(f"{p}: the tokenizer has ids up to {tokenizer.id_count - 1}, the "
                                   f"embedding only {cfg.vocab_size} rows")
        tokenizer.chat_template = template
    # The re-encoded matrices share huge pages (see Arena). The q8_0 ones that the integer modes
    # repack and then drop go in chunks of 16 MB: pinned by 64 MB chunks, they made the load of
    # the demo model peak 68 MB higher (16 MB: within 5 MB of separate arrays; with no arena,
    # 230 MB higher, glibc keeping their freed memory). The kept BF16 ones decoded 11% slower
    # from 16 MB chunks than from 64 MB ones, for a reason not found.
    repacked = dtype == "q8_0" and activations != "f32"
    arena = Arena(chunk=16 << 20) if repacked else Arena()
    convert = (lambda t: convert_tensor(t, dtype, arena)) if dtype else None
    weights = Weights(cfg, tensors, convert)
    return Model(cfg, weights, tokenizer=tokenizer, context=context, threads=threads,
                 generation_defaults=gen, chat_template=template, source=str(p),
                 activations=activations, kv_cache=kv_cache)


def _is_gguf(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError as exc:
        raise ModelFormatError(f"{p}: cannot read: {exc.strerror or exc}") from None
