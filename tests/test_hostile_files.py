"""Hostile model files, one defect at a time: each is refused at load with a ModelFormatError
subclass naming the file (and what is wrong), never a bare KeyError/TypeError/struct.error/...,
a crash, a hang or a huge allocation. The models are the fuzzing seeds (tests/fuzzing.py): a
small GGUF made from the demo's header and a transformers-written model directory."""
import json
import shutil
import struct
import time
import tracemalloc

import numpy as np
import pytest

import qwenc
from fuzzing import Workspace, write_gguf
from qwenc.errors import (ChatTemplateError, ConfigError, GGUFError, ModelFormatError, TokenizerError,
                          UnsupportedTokenizer, WeightError, WeightFileError)
from qwenc.formats import gguf as G


@pytest.fixture(scope="module")
def ws(demo_gguf, tmp_path_factory):
    return Workspace(tmp_path_factory.mktemp("hostile"), demo_gguf)


@pytest.fixture
def model_dir(ws, tmp_path):
    return shutil.copytree(ws.hf_dir, tmp_path / "model")


def refused(path, error=ModelFormatError, match=None, names=None):
    """qwenc.load(path) raises `error` (matching `match`) whose message names `names`."""
    with pytest.raises(error, match=match) as info:
        qwenc.load(path, context=16)
    assert str(names or path) in str(info.value), info.value
    return info.value


def edit_json(path, change):
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def test_seeds_load(ws, model_dir):
    """The unmodified seeds load and run: every refusal below is the edit's doing."""
    for path in (model_dir, _gguf(ws, ws.mini, model_dir.parent / "mini.gguf")):
        model = qwenc.load(path, context=16)
        assert model.logits([1, 2]).shape == (model.config.vocab_size,)
        assert model.tokenizer.decode(model.tokenizer.encode("hello world")) == "hello world"


# ---------------------------------------------------------------- safetensors

def _shard(model_dir):
    return sorted(model_dir.glob("model-*.safetensors"))[0]


def _rewrite_header(path, change=None, length=None, raw_header=None):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    if change:
        change(header)
    text = raw_header if raw_header is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + raw[8 + n:])


def _first_tensor(header):
    return next(k for k in header if k != "__metadata__")


@pytest.mark.parametrize("case,match", [
    (lambda p: p.write_bytes(b"\x01\x02"), "too short"),
    (lambda p: p.write_bytes(b""), "too short"),
    (lambda p: _rewrite_header(p, length=2**63), "runs past the end"),
    (lambda p: _rewrite_header(p, length=2**64 - 1), "runs past the end"),
    (lambda p: _rewrite_header(p, raw_header=b"{not json"), "not valid JSON"),
    (lambda p: _rewrite_header(p, raw_header=b"\xff\xfe{}"), "not UTF-8"),
    (lambda p: _rewrite_header(p, raw_header=b"[1, 2, 3]"), "not a JSON object"),
    (lambda p: _rewrite_header(p, raw_header=b'{"a": {}, "a": {}}'), "twice"),
    (lambda p: _rewrite_header(p, raw_header=b"[" * 100000 + b"]" * 100000), "nested too deeply"),
    (lambda p: _rewrite_header(p, lambda h: h.update({_first_tensor(h): [1, 2]})), "not an object"),
    (lambda p: _rewrite_header(p, lambda h: h[_first_tensor(h)].update(dtype="I64")), "dtype 'I64'"),
    (lambda p: _rewrite_header(p, lambda h: h[_first_tensor(h)].update(dtype=None)), "dtype None"),
    (lambda p: _rewrite_header(p, lambda h: h[_first_tensor(h)].update(shape=[-1, 64])), "shape"),
    (lambda p: _rewrite_header(p, lambda h: h[_first_tensor(h)].update(shape=["64"])), "shape"),
    (lambda p: _rewrite_header(p, lambda h: h[_first_tensor(h)].update(shape=[2**40, 2**40])), "does not match"),
    (lambda p: _rewrite_header(p, lambda h: h[_first_tensor(h)].update(data_offsets=[0])), "pair of integers"),
    (lambda p: _rewrite_header(p, lambda h: h[_first_tensor(h)].update(data_offsets=[0, 2**62])), "outside"),
    (lambda p: _rewrite_header(p, lambda h: h[_first_tensor(h)].update(data_offsets=[-128, 0])), "outside"),
    (lambda p: _rewrite_header(p, lambda h: h[_first_tensor(h)].update(data_offsets=[4, 2])), "outside"),
], ids=["2-bytes", "empty", "len-2^63", "len-max", "not-json", "not-utf8", "array", "dup-key", "deep",
        "entry-list", "dtype-I64", "dtype-null", "shape-negative", "shape-str", "shape-huge", "offsets-one",
        "offsets-past-eof", "offsets-negative", "offsets-reversed"])
def test_bad_safetensors(model_dir, case, match):
    shard = _shard(model_dir)
    case(shard)
    refused(model_dir, WeightFileError, match, names=shard)


def test_overlapping_tensors_are_refused(model_dir):
    shard = _shard(model_dir)

    def overlap(h):  # two tensors of one shape and dtype made to share their bytes
        groups = {}
        for k, v in h.items():
            if k != "__metadata__":
                groups.setdefault((tuple(v["shape"]), v["dtype"]), []).append(k)
        a, b = next(g for g in groups.values() if len(g) > 1)[:2]
        h[b]["data_offsets"] = h[a]["data_offsets"]
    _rewrite_header(shard, overlap)
    refused(model_dir, WeightFileError, "share bytes", names=shard)


@pytest.mark.parametrize("target", ["../outside.safetensors", "/etc/passwd", "sub/model.safetensors", 7, ""])
def test_shard_index_cannot_point_outside(model_dir, target):
    index = model_dir / "model.safetensors.index.json"
    edit_json(index, lambda d: d["weight_map"].update({next(iter(d["weight_map"])): target}))
    refused(model_dir, WeightFileError, "not a file name", names=index)


def test_shard_name_the_file_system_refuses(model_dir):
    """A shard name longer than a file name may be (ENAMETOOLONG from the stat, which pathlib's
    is_file passes on): qwenc's own error, naming the index."""
    index = model_dir / "model.safetensors.index.json"
    edit_json(index, lambda d: d["weight_map"].update({next(iter(d["weight_map"])): "A" * 4000}))
    refused(model_dir, WeightFileError, "cannot be opened", names=index)


def test_shard_index_problems(model_dir):
    index = model_dir / "model.safetensors.index.json"
    original = index.read_text()
    index.write_text("{")
    refused(model_dir, WeightFileError, "not valid JSON", names=index)
    index.write_text(json.dumps({"weight_map": []}))
    refused(model_dir, WeightFileError, "weight_map", names=index)
    doc = json.loads(original)
    name, shard = next(iter(doc["weight_map"].items()))
    other = next(f for f in doc["weight_map"].values() if f != shard)
    doc["weight_map"][name] = other  # says the tensor is in a shard that does not hold it
    index.write_text(json.dumps(doc))
    refused(model_dir, WeightFileError, "does not hold it", names=index)


def test_tensor_in_two_shards(model_dir):
    a, b = sorted(model_dir.glob("model-*.safetensors"))[:2]
    raw_a, raw_b = a.read_bytes(), b.read_bytes()
    na, nb = struct.unpack("<Q", raw_a[:8])[0], struct.unpack("<Q", raw_b[:8])[0]
    ha, hb = json.loads(raw_a[8:8 + na]), json.loads(raw_b[8:8 + nb])
    stolen = _first_tensor(ha)
    hb[stolen] = ha[stolen]  # the same bytes range of b's data: its length matches whatever is there
    hb[stolen]["data_offsets"] = [0, ha[stolen]["data_offsets"][1] - ha[stolen]["data_offsets"][0]]
    for k in list(hb):
        if k not in (stolen, "__metadata__"):
            del hb[k]
    text = json.dumps(hb).encode()
    b.write_bytes(struct.pack("<Q", len(text)) + text + raw_b[8 + nb:])
    (model_dir / "model.safetensors.index.json").unlink()
    refused(model_dir, WeightFileError, "also in")


def test_shapes_disagreeing_with_the_config(model_dir):
    edit_json(model_dir / "config.json", lambda c: c.update(intermediate_size=96))
    refused(model_dir, WeightError, r"mlp\.(gate|up|down)_proj\.weight .* has shape", names="model-")


# ---------------------------------------------------------------- config.json

@pytest.mark.parametrize("key,value,match", [
    ("hidden_size", "64", "hidden_size"), ("hidden_size", 64.5, "hidden_size"), ("hidden_size", True, "hidden_size"),
    ("hidden_size", -64, "hidden_size"), ("hidden_size", 0, "hidden_size"), ("hidden_size", 2**70, "hidden_size"),
    ("num_attention_heads", 0, "num_attention_heads"), ("num_hidden_layers", [2], "num_hidden_layers"),
    ("num_key_value_heads", 3, "kv heads"), ("vocab_size", -1, "vocab_size"),
    ("head_dim", 15, "even"), ("intermediate_size", "big", "intermediate_size"),
    ("tie_word_embeddings", "false", "tie_word_embeddings"), ("attention_bias", 1, "attention_bias"),
    ("rope_theta", -1e6, "rope_theta"), ("rope_theta", "1e6", "rope_theta"), ("rope_theta", 1e39, "rope_theta"),
    ("rms_norm_eps", -1e-6, "rms_norm_eps"), ("max_position_embeddings", 0, "max_position_embeddings"),
    ("rope_scaling", [1, 2], "rope_scaling"), ("rope_parameters", "yarn", "rope_parameters"),
    ("architectures", "Qwen2ForCausalLM", "architectures"), ("architectures", [3], "architectures"),
    ("eos_token_id", "x", "eos_token_id"), ("eos_token_id", [1, -2], "eos_token_id"),
])
def test_config_values_of_the_wrong_type_or_sign(model_dir, key, value, match):
    cfg = model_dir / "config.json"

    def change(c):
        if key == "rope_theta":
            c.pop("rope_parameters")  # the transformers 4 layout, where theta is top-level
        c[key] = value
    edit_json(cfg, change)
    refused(model_dir, ConfigError, match, names=cfg)


def test_config_nan_and_infinity(model_dir):
    cfg = model_dir / "config.json"
    text = cfg.read_text()
    for bad in ("NaN", "Infinity", "-Infinity"):
        doc = json.loads(text)
        doc["rms_norm_eps"] = "@"
        cfg.write_text(json.dumps(doc).replace('"@"', bad))
        refused(model_dir, ConfigError, "rms_norm_eps", names=cfg)


@pytest.mark.parametrize("content,match", [
    (b"", "not valid JSON"), (b"{", "not valid JSON"), (b"[]", "expected a JSON object"),
    (b"\xff\xfe\x00", "not UTF-8"), (b'{"a": 1, "a": 2}', "twice"), (b"[" * 50000, "nested too deeply"),
    (b'{"hidden_size": ' + b"9" * 5000 + b"}", "not valid JSON"),
])
def test_config_not_json(model_dir, content, match):
    cfg = model_dir / "config.json"
    cfg.write_bytes(content)
    refused(model_dir, ConfigError, match, names=cfg)


def test_config_too_large_is_not_read(model_dir):
    cfg = model_dir / "config.json"
    with open(cfg, "r+b") as f:
        f.truncate(2 << 20)  # sparse: nothing is written, the reader must not read it
    refused(model_dir, ConfigError, "more than", names=cfg)


# ---------------------------------------------------------------- tokenizer files

@pytest.mark.parametrize("change,error,match", [
    (lambda t: t.update(model=[]), TokenizerError, "'model' must be an object"),
    (lambda t: t["model"].update(vocab=[]), TokenizerError, "vocab"),
    (lambda t: t["model"]["vocab"].update({"Ġx": -5}), TokenizerError, "not an id"),
    (lambda t: t["model"]["vocab"].update({"Ġx": "7"}), TokenizerError, "not an id"),
    (lambda t: t["model"]["vocab"].update({"Ġx": 3}), TokenizerError, "two tokens"),
    (lambda t: t["model"]["vocab"].update({"Ġx": 10**9}), TokenizerError, "run to"),
    (lambda t: t["model"].update(merges=[["a"]]), TokenizerError, "merges"),
    (lambda t: t["model"].update(merges=[1, 2]), TokenizerError, "merges"),
    (lambda t: t["model"].update(merges=["Ġ zzzz"]), TokenizerError, "missing from the vocabulary"),
    (lambda t: t["model"]["vocab"].pop("a"), TokenizerError, "byte 0x61"),
    (lambda t: t.update(added_tokens=[{"id": 5}]), TokenizerError, "content"),
    (lambda t: t.update(added_tokens=[{"content": "<x>", "id": -1}]), TokenizerError, "content"),
    (lambda t: t.update(added_tokens=[{"content": "<x>", "id": 10**8}]), TokenizerError, "run to"),
    (lambda t: t.update(added_tokens={}), TokenizerError, "added_tokens"),
    (lambda t: t.update(normalizer={"type": "Sequence", "normalizers": 3}), TokenizerError, "normalizer"),
    (lambda t: t.update(normalizer="NFC"), TokenizerError, "normalizer"),
    (lambda t: t.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [1, 2]}), UnsupportedTokenizer,
     "pre-tokenizer"),
    (lambda t: t.update(decoder=None), UnsupportedTokenizer, "decoder"),
    (lambda t: t.pop("model"), UnsupportedTokenizer, "only BPE"),
])
def test_malformed_tokenizer_json(model_dir, change, error, match):
    path = model_dir / "tokenizer.json"
    edit_json(path, change)
    refused(model_dir, error, match, names=path)


def test_tokenizer_json_not_json(model_dir):
    path = model_dir / "tokenizer.json"
    path.write_bytes(path.read_bytes()[:1000])
    refused(model_dir, TokenizerError, "not valid JSON", names=path)


def test_tokenizer_config_malformed(model_dir):
    path = model_dir / "tokenizer_config.json"
    path.write_text("{'single': 'quotes'}")
    refused(model_dir, ModelFormatError, "not valid JSON", names=path)
    path.write_text(json.dumps({"chat_template": 42}))
    refused(model_dir, ChatTemplateError, "chat_template", names=path)
    path.write_text(json.dumps({"chat_template": [{"name": "default"}]}))
    refused(model_dir, ChatTemplateError, "pairs", names=path)


def test_tokenizer_bigger_than_the_embedding(model_dir):
    edit_json(model_dir / "tokenizer.json",
              lambda t: t["added_tokens"].append({"content": "<extra>", "id": 500, "special": True}))
    refused(model_dir, ModelFormatError, "embedding only")


@pytest.mark.parametrize("content,match", [
    ('{"temperature": "hot"}', "temperature"), ('{"top_k": -1}', "top_k"), ('{"top_p": 0}', "top_p"),
    ('{"max_new_tokens": 1.5}', "max_new_tokens"), ('{"eos_token_id": {"a": 1}}', "eos_token_id"),
    ('{"repetition_penalty": NaN}', "repetition_penalty"), ("[]", "object"), ("{", "not valid JSON"),
])
def test_generation_config_checked_at_load(model_dir, content, match):
    path = model_dir / "generation_config.json"
    path.write_text(content)
    refused(model_dir, ConfigError, match, names=path)


# ---------------------------------------------------------------- chat templates

def _set_template(model_dir, template):
    edit_json(model_dir / "tokenizer_config.json", lambda c: c.update(chat_template=template))


def test_template_that_does_not_parse_is_refused_at_load(model_dir):
    _set_template(model_dir, "{% for m in messages %}{{ m.content }")
    refused(model_dir, ChatTemplateError, "invalid chat template", names=model_dir / "tokenizer_config.json")
    _set_template(model_dir, "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}")
    refused(model_dir, ChatTemplateError, "invalid chat template", names=model_dir / "tokenizer_config.json")


def test_chat_template_jinja_not_utf8(model_dir):
    path = model_dir / "chat_template.jinja"
    path.write_bytes(b"{{ messages }}\xff")
    refused(model_dir, ChatTemplateError, "not UTF-8", names=path)


SLOW = [
    "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
    "{% for a in range(100000) %}{% for b in range(100000) %}{{ a }}{% endfor %}{% endfor %}",
    "{% set s = 'x' * 1000000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
    "{% macro m(x) %}{{ m(x) }}{% endmacro %}{{ m(1) }}",
    "{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
    "{% set ns = namespace(n=3) %}{% for i in range(64) %}{% set ns.n = ns.n * ns.n %}{% endfor %}",
    "{{ 'ab' * 999999999 }}", "{{ [1] * 999999999 }}", "{{ [('x' * 1000000)] * 1000 }}",
    "{{ 'a'|center(999999999) }}", "{{ ('x\n' * 100000)|indent(100000) }}", "{{ 'x'.ljust(999999999) }}",
    "{{ '{:>999999999}'.format(1) }}", "{{ '%0999999999d' % 1 }}", "{{ '%*d' % (999999999, 1) }}",
    "{{ ('x' * 100000).replace('', 'y' * 10000) }}", "{{ ('x' * 30000000).join(range(9)|map('string')) }}",
    "{{ 9 ** 99999999 }}", "{{ messages|tojson(indent=999999999) }}",
    "{{ range(100000)|join('x' * 100000) }}", "{{ ('a' * 10000000) ~ ('b' * 10000000) ~ ('c' * 20000000) }}",
    "{{ lipsum(999999) }}",  # found by the fuzzer: Jinja's global ran out of memory in one call
    "".join(f"{{% set a{i} = 'x' * 30000000 %}}" for i in range(40)),  # many values, each allowed
]


@pytest.mark.parametrize("template", SLOW, ids=range(len(SLOW)))
def test_template_that_loops_or_grows_stops_in_bounded_time(model_dir, template):
    """A template may not run forever or allocate gigabytes: it ends in ChatTemplateError, fast."""
    _set_template(model_dir, template)
    model = qwenc.load(model_dir, context=16)
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(ChatTemplateError):
            model.chat_template.render([{"role": "user", "content": "hi"}])
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert time.perf_counter() - t0 < 30
    assert peak < 1 << 30, f"{peak / 2**20:.0f} MiB allocated"


def test_template_that_raises(model_dir):
    _set_template(model_dir, "{{ raise_exception('roles must alternate') }}")
    model = qwenc.load(model_dir, context=16)
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        model.chat([{"role": "user", "content": "hi"}], max_tokens=1)


def test_budget_leaves_real_templates_alone(ws):
    """Qwen2.5's template on a long conversation with tools renders as the unguarded sandbox does."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from qwenc.text import chat_template as ct
    template = dict((k, v) for k, _, v in ws.mini["kvs"])["tokenizer.chat_template"]
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                          extensions=[ct._GenerationTag, jinja2.ext.loopcontrols])
    plain.filters["tojson"] = ct._tojson
    plain.globals.update(ct.ENVIRONMENT.globals)
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 50} for i in range(400)]
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}} for i in range(20)]
    variables = ct.template_variables(messages, True, tools)
    assert ct.render_compiled(ct.compile_chat_template(template), variables) == \
        plain.from_string(template).render(**variables)


# ---------------------------------------------------------------- GGUF

def _gguf(ws, parts, path):
    path.write_bytes(write_gguf(parts))
    return path


def _parts(ws, kvs=None, tensors=None, **extra):
    p = {**ws.mini, **extra}
    p["kvs"] = list(ws.mini["kvs"]) if kvs is None else kvs
    p["tensors"] = list(ws.mini["tensors"]) if tensors is None else tensors
    return p


def _set_kv(kvs, key, vtype, value):
    out = [kv for kv in kvs if kv[0] != key]
    return out + [(key, vtype, value)]


def _retype_tensor(ws, name, ttype):
    """The mini GGUF with tensor `name` stored as `ttype` (its bytes resized to match)."""
    tensors, data, out = ws.mini["tensors"], ws.mini["data"], []
    blob = bytearray()
    for tname, dims, tt, off in tensors:
        end = next((o for _, _, _, o in tensors if o > off), len(data))
        raw = data[off:end]
        if tname == name:
            tt = ttype
            _, elems, nbytes = G.GGML_TYPES[ttype]
            raw = bytes(int(np.prod(dims)) // elems * nbytes)
        blob.extend(b"\0" * (-len(blob) % 32))
        out.append((tname, dims, tt, len(blob)))
        blob.extend(raw)
    blob.extend(b"\0" * (-len(blob) % 32))
    return {**ws.mini, "tensors": out, "data": bytes(blob)}


@pytest.mark.parametrize("ttype", [10, 11, 16, 19, 23, 15])  # Q2_K, Q3_K, IQ2_XXS, IQ1_S, IQ4_XS, Q8_K
def test_types_qwenc_cannot_compute_are_refused_at_load(ws, tmp_path, ttype):
    path = _gguf(ws, _retype_tensor(ws, "blk.1.ffn_down.weight", ttype), tmp_path / "q.gguf")
    err = refused(path, WeightError, "cannot compute")
    assert "model.layers.1.mlp.down_proj.weight" in str(err) and G.GGML_TYPES[ttype][0] in str(err)


def test_embedding_of_a_type_qwenc_cannot_compute(ws, tmp_path):
    path = _gguf(ws, _retype_tensor(ws, "token_embd.weight", 20), tmp_path / "e.gguf")  # IQ4_NL
    refused(path, WeightError, "embed_tokens.*IQ4_NL")


@pytest.mark.parametrize("key,vtype,value,match", [
    ("qwen2.embedding_length", G.STRING, "64", "embedding_length"),
    ("qwen2.block_count", G.FLOAT32, 2.0, "block_count"),
    ("qwen2.attention.head_count", G.UINT32, 0, "head_count"),
    ("qwen2.attention.layer_norm_rms_epsilon", G.STRING, "1e-6", "layer_norm_rms_epsilon"),
    ("qwen2.rope.freq_base", G.FLOAT32, -1.0, "rope_theta"),
    ("qwen2.context_length", G.UINT64, 2**63, "context_length"),
    ("general.architecture", G.ARRAY, (G.STRING, ["qwen2"]), "architecture"),
    ("general.architecture", G.UINT32, 7, "architecture"),
    ("tokenizer.ggml.tokens", G.ARRAY, (G.INT32, [1, 2, 3]), "tokens"),
    ("tokenizer.ggml.tokens", G.STRING, "abc", "tokens"),
    ("tokenizer.ggml.token_type", G.ARRAY, (G.INT32, [1]), "token_type"),
    ("tokenizer.ggml.token_type", G.ARRAY, (G.UINT64, [2**63] * 422), "token_type"),
    ("tokenizer.ggml.merges", G.ARRAY, (G.UINT8, [1]), "merges"),
    ("tokenizer.ggml.eos_token_id", G.UINT32, 10**6, "eos_token_id"),
    ("tokenizer.ggml.eos_token_id", G.STRING, "x", "eos_token_id"),
    ("tokenizer.chat_template", G.UINT32, 5, "chat_template"),
    ("tokenizer.chat_template", G.STRING, "{% if %}", "invalid chat template"),
    ("tokenizer.chat_template", G.STRING, b"{{ messages }}\xff", "not UTF-8"),
    ("tokenizer.chat_templates", G.STRING, "tool_use", "chat_templates"),
    ("general.alignment", G.UINT32, 0, "alignment"),
    ("general.alignment", G.STRING, "32", "alignment"),
])
def test_gguf_metadata_of_the_wrong_type_or_range(ws, tmp_path, key, vtype, value, match):
    path = _gguf(ws, _parts(ws, kvs=_set_kv(ws.mini["kvs"], key, vtype, value)), tmp_path / "m.gguf")
    refused(path, ModelFormatError, match)


def test_gguf_added_token_not_utf8(ws, tmp_path):
    """An added token (control or user-defined, not in the byte-level vocabulary) whose bytes are
    not UTF-8 (here a UTF-8-encoded surrogate) is refused with TokenizerError, like a vocabulary
    token or merge that is not, not left to raise UnicodeEncodeError."""
    md = dict((k, v) for k, _, v in ws.mini["kvs"])
    tokens, ttypes = list(md["tokenizer.ggml.tokens"][1]), md["tokenizer.ggml.token_type"][1]
    tid = next(i for i, t in enumerate(ttypes) if t == 3)
    tokens[tid] = b"\xed\xb2\x80".decode("utf-8", "surrogateescape")
    kvs = _set_kv(ws.mini["kvs"], "tokenizer.ggml.tokens", G.ARRAY, (G.STRING, tokens))
    err = refused(_gguf(ws, _parts(ws, kvs=kvs), tmp_path / "t.gguf"), TokenizerError, "not valid UTF-8")
    assert f"added token {tid}" in str(err)


def test_gguf_missing_keys(ws, tmp_path):
    for key in ("qwen2.embedding_length", "qwen2.block_count", "tokenizer.ggml.merges"):
        kvs = [kv for kv in ws.mini["kvs"] if kv[0] != key]
        refused(_gguf(ws, _parts(ws, kvs=kvs), tmp_path / "k.gguf"), ModelFormatError, key.split(".")[-1])


def test_gguf_overlapping_tensors(ws, tmp_path):
    tensors = list(ws.mini["tensors"])
    name, dims, tt, off = tensors[3]
    tensors[3] = (name, dims, tt, tensors[2][3])
    refused(_gguf(ws, _parts(ws, tensors=tensors), tmp_path / "o.gguf"), GGUFError, "share bytes")


def test_gguf_tensor_shapes(ws, tmp_path):
    tensors = list(ws.mini["tensors"])
    tensors[0] = ("token_embd.weight", (64 * 422,), tensors[0][2], 0)  # 1-D embedding
    refused(_gguf(ws, _parts(ws, tensors=tensors), tmp_path / "s.gguf"), GGUFError, "token_embd")
    tensors = [t if t[0] != "blk.0.attn_k.weight" else (t[0], (64, 16), t[2], t[3]) for t in ws.mini["tensors"]]
    refused(_gguf(ws, _parts(ws, tensors=tensors), tmp_path / "s.gguf"), WeightError, "k_proj.*shape")
    tensors = list(ws.mini["tensors"]) + [("output.weight", (64, 0), 0, 0), ("lm_head.weight", (64, 0), 0, 0)]
    refused(_gguf(ws, _parts(ws, tensors=tensors), tmp_path / "s.gguf"), GGUFError, "both stand for")


@pytest.mark.parametrize("what", ["metadata", "tensors", "strings", "arrays", "bytes"])
def test_absurd_counts_allocate_nothing(ws, tmp_path, what):
    """Counts are checked against the bytes left in the file before anything is allocated."""
    kvs = list(ws.mini["kvs"])
    raw = bytearray(write_gguf(ws.mini))
    if what == "metadata":
        struct.pack_into("<Q", raw, 16, 2**40)
    elif what == "tensors":
        struct.pack_into("<Q", raw, 8, 2**40)
    else:
        etype = {"strings": G.STRING, "arrays": G.ARRAY, "bytes": G.UINT8}[what]
        kvs.insert(0, ("x.big", G.ARRAY, (etype, [])))
        raw = bytearray(write_gguf(_parts(ws, kvs=kvs)))
        at = raw.index(b"x.big") + len(b"x.big") + 4 + 4
        struct.pack_into("<Q", raw, at, 2**40)
    path = tmp_path / "big.gguf"
    path.write_bytes(bytes(raw))
    refused_allocating_little(path, "truncated")


def refused_allocating_little(path, match, limit=64 << 20):
    tracemalloc.start()
    try:
        refused(path, GGUFError, match)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < limit, f"{peak / 2**20:.0f} MiB allocated to refuse {path.name}"


@pytest.mark.parametrize("what", ["tensor name", "metadata key", "string value", "array"])
def test_lengths_the_file_could_hold_still_allocate_little(ws, tmp_path, what):
    """A length or count that fits in the file's size (here a sparse 1.2 GB file) is bounded by
    what real files use, not only by the bytes left: otherwise a header field could make Python
    objects of gigabytes out of the zeros behind it."""
    kvs = list(ws.mini["kvs"])
    if what in ("string value", "array"):
        kvs.insert(0, ("x.big", G.STRING, "abc") if what == "string value" else ("x.big", G.ARRAY, (G.UINT8, [1])))
    raw = bytearray(write_gguf(_parts(ws, kvs=kvs)))
    if what == "tensor name":
        at = raw.index(b"token_embd.weight") - 8
    elif what == "metadata key":
        at = raw.index(kvs[0][0].encode()) - 8
    else:
        at = raw.index(b"x.big") + len(b"x.big") + 4 + (4 if what == "array" else 0)
    struct.pack_into("<Q", raw, at, 1 << 30)
    path = tmp_path / "long.gguf"
    with open(path, "wb") as f:
        f.write(bytes(raw))
        f.truncate(len(raw) + (1200 << 20))
    refused_allocating_little(path, "at most")
