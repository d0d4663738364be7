"""What models qwenc can find on this machine, described from their headers (`qwenc models`).

Three places are looked in: the HuggingFace hub cache (every snapshot: its model directory and
each GGUF model in it), the demo models (assembled, or installed and assembled on first use), and
$QWENC_MODEL when it is a local path. Each model is described by its architecture, parameter
count, quantization, context length and size on disk, read from config.json, the safetensors
headers or the GGUF header; no weight is read.
"""
import json
import os
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import QwencError
from . import demo as demos
from .config import config_from_dict
from .hub import (DEFAULT_REVISION, gguf_groups, hub_cache_dir, is_model_dir, model_dir_files)

# GGUF general.file_type (llama.cpp's llama_ftype): what the file as a whole was quantized to.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
    18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
    25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
    32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0",
}


@dataclass
class ModelInfo:
    name: str                 # what -m takes to get this model
    path: Path
    where: str                # "hf-cache", "demo", "QWENC_MODEL"
    arch: str = None
    params: int = None
    quant: str = None
    context: int = None
    size: int = None          # bytes on disk (all files of the model)
    note: str = ""
    files: list = field(default_factory=list)


# ---------------------------------------------------------------- reading headers

def _size(paths):
    return sum(os.path.getsize(p) for p in paths)


def describe_gguf(path) -> dict:
    from .gguf import GGML_TYPES, gguf_to_hf, open_gguf
    gf = open_gguf(path)
    md = gf.metadata
    arch = md.get("general.architecture")
    quant = FILE_TYPES.get(md.get("general.file_type"))
    if quant is None:
        # No file type stated: the storage type holding most of the matrix bytes.
        by_type = Counter()
        for info in gf.tensors.values():
            if len(info.shape) == 2:
                by_type[GGML_TYPES[info.dtype][0]] += info.nbytes
        quant = by_type.most_common(1)[0][0] if by_type else None
    context = md.get(f"{arch}.context_length")
    try:
        context = config_from_dict(gguf_to_hf(gf)[0], str(path)).context_length
    except QwencError:
        pass  # a model qwenc cannot run is still listed, with the header's figure
    return dict(arch=arch, params=sum(t.n_elements for t in gf.tensors.values()), quant=quant,
                context=int(context) if context is not None else None, size=_size(gf.paths), files=gf.paths)


def _safetensors_header(path) -> dict:
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise QwencError(f"{path}: too short to be a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > os.path.getsize(path) - 8:
            raise QwencError(f"{path}: header length {n} runs past the end of the file")
        return json.loads(f.read(n))


def describe_model_dir(model_dir) -> dict:
    model_dir = Path(model_dir)
    names = [p.name for p in model_dir.iterdir()]
    if (model_dir / "model.safetensors.index.json").is_file():
        weight_map = json.loads((model_dir / "model.safetensors.index.json").read_text()).get("weight_map", {})
        weights = sorted(set(weight_map.values()))
    else:
        weights = model_dir_files(names)[1]
    cfg = json.loads((model_dir / "config.json").read_text())
    params, by_dtype = 0, Counter()
    for w in weights:
        for name, t in _safetensors_header(model_dir / w).items():
            if name == "__metadata__":
                continue
            n = 1
            for d in t["shape"]:
                n *= int(d)
            params += n
            by_dtype[t["dtype"]] += n
    files = [model_dir / n for n in model_dir_files(names)[0] if (model_dir / n).is_file()]
    files += [model_dir / w for w in weights]
    text = cfg.get("text_config") or {}
    context = cfg.get("max_position_embeddings", text.get("max_position_embeddings"))
    try:
        context = config_from_dict(cfg).context_length
    except QwencError:
        pass
    return dict(arch=cfg.get("model_type"), params=params,
                quant=by_dtype.most_common(1)[0][0] if by_dtype else None,
                context=int(context) if context is not None else None, size=_size(files), files=files)


def describe(path) -> dict:
    """Architecture, parameters, quantization, context length and size of a model on disk."""
    path = Path(path)
    if path.is_dir():
        return describe_model_dir(path)
    return describe_gguf(path)


def _entry(name, path, where, note=""):
    info = ModelInfo(name, Path(path), where, note=note)
    try:
        for k, v in describe(path).items():
            setattr(info, k, v)
    except (QwencError, OSError, ValueError, KeyError, TypeError) as exc:
        info.note = f"unreadable: {exc}"
    return info


# ---------------------------------------------------------------- where models are

def _snapshots(repo: Path):
    """(commit, snapshot dir, the refs naming it) for each snapshot of one cached repo."""
    refs = {}
    if (repo / "refs").is_dir():
        for ref in (repo / "refs").rglob("*"):
            if ref.is_file():
                refs.setdefault(ref.read_text().strip(), []).append(ref.relative_to(repo / "refs").as_posix())
    snaps = repo / "snapshots"
    if not snaps.is_dir():
        return []
    return [(s.name, s, sorted(refs.get(s.name, []))) for s in sorted(snaps.iterdir()) if s.is_dir()]


def hf_cache_models(cache: Path = None):
    cache = Path(cache) if cache else hub_cache_dir()
    found = []
    if not cache.is_dir():
        return found
    for repo in sorted(cache.glob("models--*")):
        repo_id = repo.name[len("models--"):].replace("--", "/", 1)
        for commit, snap, refs in _snapshots(repo):
            # The name that gets this snapshot back: the default branch needs no revision.
            rev = "" if DEFAULT_REVISION in refs else f"@{refs[0] if refs else commit}"
            names = [p.relative_to(snap).as_posix() for p in snap.rglob("*") if p.is_file()]
            if is_model_dir(names):
                found.append(_entry(repo_id + rev, snap, "hf-cache"))
            try:
                groups = gguf_groups(names)
            except QwencError as exc:  # an incompletely downloaded split model
                found.append(ModelInfo(repo_id + rev, snap, "hf-cache", note=str(exc)))
                continue
            labels = Counter(g.quant for g in groups)
            for g in groups:
                if len(groups) == 1:
                    name = repo_id
                elif g.quant and labels[g.quant] == 1:
                    name = f"{repo_id}:{g.quant}"
                else:
                    name = f"{repo_id}/{g.entry}"
                found.append(_entry(name + rev, snap / g.entry, "hf-cache"))
    return found


def demo_models():
    found = []
    for name, model in demos.DEMOS.items():
        path = demos.assembled_path(name)
        if path is not None:
            found.append(_entry(name, path, "demo"))
        elif demos.part_paths(model) is not None:
            found.append(ModelInfo(name, demos.cache_dir() / model.filename, "demo", quant="Q4_K_M",
                                   size=model.size, note=f"installed; assembled on first use ({model.title})"))
    return found


def find_models():
    """Every model qwenc can find, the $QWENC_MODEL path first."""
    found = []
    env = os.environ.get("QWENC_MODEL")
    if env and Path(os.path.expanduser(env)).exists():
        found.append(_entry(env, Path(os.path.expanduser(env)), "QWENC_MODEL"))
    return found + hf_cache_models() + demo_models()


def missing_demos():
    return [m for name, m in demos.DEMOS.items()
            if demos.assembled_path(name) is None and demos.part_paths(m) is None]
