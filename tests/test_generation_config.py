import json

import pytest

from qwenc.formats.generation_config import load_generation_defaults, resolve_sampling

# Qwen2.5-0.5B-Instruct's generation_config.json.
QWEN25_INSTRUCT = {
    "bos_token_id": 151643, "pad_token_id": 151643, "do_sample": True,
    "eos_token_id": [151645, 151643], "repetition_penalty": 1.1, "temperature": 0.7,
    "top_p": 0.8, "top_k": 20, "transformers_version": "4.37.0",
}


def write(tmp_path, config):
    (tmp_path / "generation_config.json").write_text(
        config if isinstance(config, str) else json.dumps(config), encoding="utf-8")
    return tmp_path


def test_qwen25_defaults(tmp_path):
    defaults = load_generation_defaults(write(tmp_path, QWEN25_INSTRUCT))
    assert defaults == {"eos_token_id": [151645, 151643], "repetition_penalty": 1.1,
                        "temperature": 0.7, "top_p": 0.8, "top_k": 20}


def test_missing_file_gives_nothing(tmp_path):
    assert load_generation_defaults(tmp_path) == {}
    assert load_generation_defaults(tmp_path / "no-such-dir") == {}
    assert resolve_sampling({}) == {}


def test_eos_int_becomes_list_and_optional_keys(tmp_path):
    defaults = load_generation_defaults(write(tmp_path, {
        "eos_token_id": 151645, "min_p": 0.05, "max_new_tokens": 512, "top_k": None}))
    assert defaults == {"eos_token_id": [151645], "min_p": 0.05, "max_new_tokens": 512}


def test_do_sample_false_means_greedy(tmp_path):
    defaults = load_generation_defaults(write(tmp_path, {"do_sample": False, "temperature": 0.7}))
    assert defaults["temperature"] == 0.0
    assert load_generation_defaults(write(tmp_path, {"do_sample": False}))["temperature"] == 0.0
    # do_sample absent: the temperature stands (vLLM's reading of such files).
    assert load_generation_defaults(write(tmp_path, {"temperature": 0.6}))["temperature"] == 0.6
    # An explicit request still wins over the model's greedy default.
    assert resolve_sampling(defaults, temperature=0.9)["temperature"] == 0.9


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"eos_token_id": "x"}',
                                     '{"eos_token_id": [1, -2]}'])
def test_bad_files(tmp_path, content):
    with pytest.raises(ValueError, match="generation_config.json"):
        load_generation_defaults(write(tmp_path, content))


def test_overrides_win_unless_none(tmp_path):
    defaults = load_generation_defaults(write(tmp_path, QWEN25_INSTRUCT))
    got = resolve_sampling(defaults, temperature=0, top_k=None, top_p=1, min_p=0.1, seed=3,
                           max_new_tokens=64, eos_token_id=7)
    assert got == {"eos_token_id": [7], "repetition_penalty": 1.1, "temperature": 0.0,
                   "top_p": 1.0, "top_k": 20, "min_p": 0.1, "seed": 3, "max_new_tokens": 64}
    assert defaults["temperature"] == 0.7  # the defaults are not modified
    assert isinstance(resolve_sampling({"top_k": 20.0})["top_k"], int)


@pytest.mark.parametrize("name,value,message", [
    ("temperature", -0.1, "temperature must be >= 0"),
    ("temperature", float("nan"), "temperature must be a finite number"),
    ("temperature", "hot", "temperature must be a finite number"),
    ("top_p", 0, r"top_p must be in \(0, 1\]"),
    ("top_p", 1.5, r"top_p must be in \(0, 1\]"),
    ("top_k", -1, "top_k must be >= 0"),
    ("top_k", 2.5, "top_k must be an integer"),
    ("top_k", True, "top_k must be an integer"),
    ("min_p", -0.01, r"min_p must be in \[0, 1\]"),
    ("min_p", 1.01, r"min_p must be in \[0, 1\]"),
    ("repetition_penalty", 0, "repetition_penalty must be > 0"),
    ("repetition_penalty", -1.0, "repetition_penalty must be > 0"),
    ("max_new_tokens", 0, "max_new_tokens must be >= 1"),
])
def test_validation(name, value, message):
    with pytest.raises(ValueError, match=message):
        resolve_sampling({}, **{name: value})
    # The same bad value coming from the model's file says so.
    with pytest.raises(ValueError, match="generation_config.json"):
        resolve_sampling({name: value})


@pytest.mark.parametrize("name,value", [("temperature", 0), ("top_p", 1), ("top_k", 0),
                                        ("min_p", 0), ("min_p", 1), ("repetition_penalty", 1e-3)])
def test_boundaries_accepted(name, value):
    assert resolve_sampling({}, **{name: value})[name] == value


def test_unknown_override_is_rejected():
    with pytest.raises(TypeError, match="temprature"):
        resolve_sampling({}, temprature=0.5)
