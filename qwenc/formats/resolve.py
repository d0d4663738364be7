"""Where a model name leads: a local path (GGUF file or model directory) or a hub repo id."""
import os
from pathlib import Path

from ..errors import ModelNotFound


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
        raise ModelNotFound(f"model '{spec}' is neither a local path nor in the HuggingFace cache ({hub})")
    raise ModelNotFound(f"model path '{spec}' does not exist")
