"""A bounded fuzz run of every model-file reader (tests/fuzzing.py), driven by hypothesis.

About 40 s in all: mutated GGUFs from the demo's header, mutated files of a HuggingFace model
directory, and the demo's own header bytes mutated. Every case must load, or be refused with a
ModelFormatError naming the file, and a loaded model must run. Under CI the cases are the same
every run (derandomized); locally each run tries new ones. `make fuzz` runs the coverage-guided
campaign (atheris) for longer.
"""
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzzing import HypothesisSource, RandomSource, Workspace, exercise, run_case

import qwenc
from qwenc.errors import ConfigError

CI = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")

# (kind, cases, the least share of them that must load: a harness that only ever produced
# unreadable files would prove nothing about the code behind the readers)
RUNS = [("gguf", 1000, 0.05), ("hf", 700, 0.15), ("demo_header", 20, 0.02)]


@pytest.fixture(scope="module")
def ws(demo_gguf, tmp_path_factory):
    return Workspace(tmp_path_factory.mktemp("fuzz"), demo_gguf)


@pytest.mark.parametrize("kind,cases,min_loaded", RUNS, ids=[r[0] for r in RUNS])
def test_hostile_files(ws, kind, cases, min_loaded):
    outcomes = []

    @settings(max_examples=cases, deadline=None, database=None, derandomize=CI, print_blob=True,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def one_case(data):
        outcomes.append(run_case(ws, kind, HypothesisSource(data)))

    one_case()
    loaded = outcomes.count("loaded") / len(outcomes)
    print(f"\n{kind}: {len(outcomes)} cases, {100 * loaded:.0f}% loaded, the rest refused")
    assert len(outcomes) >= cases // 2
    assert loaded >= min_loaded, f"only {100 * loaded:.1f}% of the {kind} cases loaded"


def test_harness_reports_a_bare_exception(ws, monkeypatch):
    """The harness itself can fail: a reader raising outside qwenc's family is not swallowed."""
    import random

    def broken(model_dir):
        raise KeyError("hidden_size")
    monkeypatch.setattr(qwenc.loader, "load_config", broken)
    with pytest.raises(KeyError):
        run_case(ws, "hf", RandomSource(random.Random(0)))


def test_harness_reports_an_error_that_names_no_file(ws, monkeypatch, tmp_path):
    def vague(model_dir):
        raise ConfigError("something is wrong")
    monkeypatch.setattr(qwenc.loader, "load_config", vague)
    with pytest.raises(AssertionError, match="does not name"):
        exercise(ws.hf_dir, str(ws.hf_dir))
