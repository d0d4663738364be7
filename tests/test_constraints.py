"""Constrained decoding: grammars compiled against Qwen's real vocabulary, masks checked against
independent oracles (Python's `re`, `jsonschema`, a plain per-token loop), and generation on a
random-weight model carrying Qwen's tokenizer, sampled at temperature 1 with many seeds.

A random-weight model picks among the allowed tokens nearly at random, which is the hard case
for a grammar: every schema here bounds its strings and forbids extra properties, so that the
output ends well within max_tokens, and every output must then parse and validate.
"""
import json
import re
import shutil
import threading
import time
from typing import List, Literal, Optional

import jsonschema
import numpy as np
import pytest
from pydantic import BaseModel, ConfigDict, Field

import qwenc
from qwenc.engine import constraints as C
from qwenc.engine.generate import Generation, generate_tokens
from qwenc.errors import ConstraintViolation, InvalidRequest
from qwenc.text.tokenizer import Tokenizer
from modelgen import make_model

EOS = (151643, 151645)
N_ROWS = 151936  # Qwen's padded embedding rows


@pytest.fixture(scope="module")
def tok(gguf_md):
    return Tokenizer.from_gguf_metadata(gguf_md)


@pytest.fixture(scope="module")
def info(tok):
    return C.TokenizerInfo(tok, N_ROWS, EOS)


def validator(schema):
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def walk(info, tok, spec, text):
    """Feed text's tokens to a fresh matcher, checking each one was allowed; return, per
    prefix (0..n tokens), whether EOS was allowed there."""
    m = C.compile_constraint(info, spec).matcher()
    ids = tok.encode(text)
    eos_allowed = []
    for t in ids + [None]:
        allowed = set(m.allowed_tokens().tolist())
        assert all(a < info.n_rows and info.real[a] for a in allowed)
        eos_allowed.append(EOS[0] in allowed and EOS[1] in allowed)
        assert (EOS[0] in allowed) == (EOS[1] in allowed) == m.can_end()
        if t is None:
            break
        assert t in allowed, (tok.decode([t]), text)
        m.accept(t)
    return ids, eos_allowed


# ---------------------------------------------------------------- EOS exactly when the grammar accepts

REGEXES = [
    (r"\d{3}-\d{4}", ["555-1234", "000-0000"]),
    (r"(yes|no)(, really)?", ["yes", "no, really"]),
    (r"[a-z]+@[a-z]+\.(com|org)", ["ada@example.com"]),
    (r"(ab)*c?", ["ababc", "abab", ""]),
]


@pytest.mark.parametrize("regex,samples", REGEXES)
def test_eos_allowed_exactly_when_the_regex_matches(info, tok, regex, samples):
    spec = {"type": "regex", "regex": regex}
    for text in samples:
        ids, eos = walk(info, tok, spec, text)
        for k in range(len(ids) + 1):
            prefix = tok.decode(ids[:k])
            assert eos[k] == (re.fullmatch(regex, prefix) is not None), (regex, prefix)


SCHEMA_DOCS = [
    ({"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}},
      "required": ["n"], "additionalProperties": False},
     ['{"n": 12, "s": "ok"}', '{"n": -3}', '{"n":0}']),
    ({"type": "array", "items": {"type": "number"}, "minItems": 1},
     ["[1.5, 2e3, -0.25]", "[7]"]),
    ({"enum": ["red", "green", 3, None]}, ['"green"', "3", "null"]),
    ({"type": "integer", "minimum": 10, "maximum": 1200}, ["10", "999", "1200"]),
]


@pytest.mark.parametrize("schema,docs", SCHEMA_DOCS)
def test_eos_allowed_exactly_when_the_json_is_complete(info, tok, schema, docs):
    v = validator(schema)
    for doc in docs:
        ids, eos = walk(info, tok, schema, doc)
        for k in range(len(ids) + 1):
            prefix = tok.decode(ids[:k])
            try:
                value = json.loads(prefix)
                complete = v.is_valid(value)
            except ValueError:
                complete = False
            if schema.get("type") == "integer" and complete:
                # "99" is complete for [10, 1200] but "1" is not (it cannot end there)
                complete = 10 <= int(prefix) <= 1200
            assert eos[k] == complete, (doc, prefix)


def test_a_terminated_grammar_allows_only_eos(info, tok):
    m = C.compile_constraint(info, {"type": "regex", "regex": "abc"}).matcher()
    for t in tok.encode("abc"):
        assert not m.is_terminated()
        m.accept(t)
    assert m.is_terminated() and m.can_end()
    assert sorted(m.allowed_tokens().tolist()) == sorted(EOS)


def test_rejected_tokens_raise(info, tok):
    m = C.compile_constraint(info, {"type": "regex", "regex": "abc"}).matcher()
    with pytest.raises(ConstraintViolation, match="not allowed"):
        m.accept(tok.encode("x")[0])
    m = C.compile_constraint(info, {"type": "regex", "regex": "abc"}).matcher()
    with pytest.raises(ConstraintViolation):
        m.accept(EOS[1])  # EOS before the grammar accepts


def test_special_tokens_and_padding_never_allowed_by_text_grammars(info, tok):
    m = C.compile_constraint(info, {"type": "regex", "regex": r"(.|\n)*"}).matcher()
    allowed = m.allowed_tokens()
    assert allowed.max() < tok.vocab_size
    specials = set(tok.added_tokens.values())
    assert not (set(allowed.tolist()) & (specials - set(EOS)))
    # A string the grammar forces whole is offered as its canonical tokens: "<tool_call>" text
    # is then the <tool_call> token, whose text it is.
    m = C.compile_constraint(info, {"type": "regex", "regex": "<tool_call>"}).matcher()
    assert m.allowed_tokens().tolist() == [tok.token_to_id("<tool_call>")]


# ---------------------------------------------------------------- compiling

class Address(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str = Field(max_length=10)
    zip: Optional[str] = Field(default=None, pattern=r"^[0-9]{5}$")


class Person(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=130)
    role: Literal["admin", "user", "guest"]
    tags: List[str] = Field(default_factory=list, max_length=3)
    home: Address
    previous: List[Address] = Field(default_factory=list, max_length=2)


def test_pydantic_objects_are_closed():
    class Loose(BaseModel):
        a: int
        inner: Address
    schema = C.pydantic_schema(Loose)
    assert schema["additionalProperties"] is False
    assert Loose.model_json_schema().get("additionalProperties") is None


def test_spec_forms_compile_and_are_cached(info):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    forms = [
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}},
        schema,
        Person,
        {"type": "json_schema", "json_schema": {"name": "p", "schema": Person}},
        {"type": "regex", "regex": r"[0-9]+"},
        {"type": "grammar", "grammar": 'start: "a" | "b" start'},            # Lark
        {"type": "grammar", "grammar": 'root ::= "x" digit+\ndigit ::= [0-9]'},  # GBNF
    ]
    for spec in forms:
        g = C.compile_constraint(info, spec)
        assert isinstance(g, C.Grammar)
        assert C.compile_constraint(info, spec) is g  # same spec, same compiled grammar
    assert C.compile_constraint(info, {"type": "text"}) is None and C.compile_constraint(info, None) is None
    # two forms of the same schema share one Grammar
    assert C.compile_constraint(info, schema) is C.compile_constraint(
        info, {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert "$defs" in Person.model_json_schema()  # the pydantic case really exercises $ref/$defs


BAD = [
    ({"type": "regex", "regex": "(unclosed"}, "regex.*unclosed group"),
    ({"type": "grammar", "grammar": "start: undefined_rule"}, "unknown name"),
    ({"type": "grammar", "grammar": "root ::= [a-"}, "grammar"),
    ({"type": "json_schema", "json_schema": {"name": "u", "schema": {"type": "array", "uniqueItems": True}}},
     "json_schema 'u'.*uniqueItems"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/nowhere"}}}, "nowhere"),
    ({"type": "integer", "minimum": 5, "maximum": 1}, "[Uu]nsatisfiable"),
    ({"type": "strnig"}, "strnig"),
    ({"type": "string", "format": "no-such-format"}, "no-such-format"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "needs 'json_schema'"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": "{not json"}}, "not valid JSON"),
    ({"type": "regex"}, "needs 'regex'"),
    ({"type": "grammar", "grammar": "  "}, "needs 'grammar'"),
    ("a string", "a constraint is a dict"),
]


@pytest.mark.parametrize("spec,message", BAD)
def test_what_cannot_compile_is_an_invalid_request_naming_it(info, spec, message):
    with pytest.raises(InvalidRequest, match=message):
        C.compile_constraint(info, spec)


def test_non_strict_schemas_ignore_unsupported_keywords(info):
    spec = {"type": "json_schema", "json_schema": {"name": "u", "strict": False,
                                                   "schema": {"type": "array", "uniqueItems": True}}}
    assert isinstance(C.compile_constraint(info, spec), C.Grammar)


@pytest.mark.parametrize("schema", [
    {"type": "string", "pattern": "(a|b)*a(a|b){60}"},   # a DFA of 2^60 states, if built eagerly
    {"type": "string", "pattern": "((x{1000}){1000}){1000}"},
    {"type": "array", "items": {"type": "string"}, "minItems": 1000000},
    {"anyOf": [{"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(j)},
                "required": [f"k{i}" for i in range(j)]} for j in range(80)]},
])
def test_pathological_schemas_compile_and_mask_in_bounded_time(info, tok, schema):
    start = time.perf_counter()
    try:
        m = C.compile_constraint(info, schema).matcher()
        m.allowed_tokens()
        for t in tok.encode('"ab' if schema.get("type") == "string" else "["):
            if t in set(m.allowed_tokens().tolist()):
                m.accept(t)
    except (InvalidRequest, ConstraintViolation):
        pass  # refusing is fine too; hanging is not
    assert time.perf_counter() - start < 10


# ---------------------------------------------------------------- masks

def naive_apply(logits, bitmask):
    out = logits.copy()
    for r in range(out.shape[0]):
        for t in range(out.shape[1]):
            w = t // 32
            if w >= bitmask.shape[1] or not (int(bitmask[r, w]) >> (t % 32)) & 1:
                out[r, t] = -np.inf
    return out


def test_apply_mask_matches_a_plain_loop():
    rng = np.random.default_rng(0)
    for rows, v, words in [(3, 1000, 32), (1, 77, 3), (2, 64, 2), (4, 200, 5)]:  # 200 > 5*32: padded columns
        logits = rng.standard_normal((rows, v)).astype(np.float32)
        bitmask = rng.integers(-2**31, 2**31, size=(rows, words), dtype=np.int64).astype(np.int32)
        ours = logits.copy()
        C.apply_mask(ours, bitmask)
        np.testing.assert_array_equal(ours, naive_apply(logits, bitmask))
        one = logits[0].copy()
        C.apply_mask(one, bitmask[0])
        np.testing.assert_array_equal(one, naive_apply(logits[:1], bitmask[:1])[0])


def test_pack_and_unpack_bits_round_trip():
    rng = np.random.default_rng(1)
    allowed = rng.random(1003) < 0.3
    words = C.pack_bits(allowed)
    assert words.dtype == np.int32 and words.shape == (32,)
    np.testing.assert_array_equal(C.unpack_bits(words, 1003), allowed)
    assert all(((int(words[t // 32]) >> (t % 32)) & 1) == allowed[t] for t in range(1003))


@pytest.mark.parametrize("threads", ["1", "2"])
def test_fill_masks_batch_equals_one_by_one(info, tok, threads, monkeypatch):
    monkeypatch.setenv("QWENC_MASK_THREADS", threads)  # in turn, and on llguidance's thread pool
    specs = [Person, {"type": "json_object"}, {"type": "regex", "regex": r"\d+(\.\d+)?"},
             {"type": "grammar", "grammar": 'root ::= ("ab" | "cd")+'}]
    prefixes = ['{"name": "Al', '{"a": [1, {"b": "', "12.", "abcd"]
    matchers = []
    for spec, prefix in zip(specs * 4, prefixes * 4):
        m = C.compile_constraint(info, spec).matcher()
        for t in tok.encode(prefix)[: len(matchers) % 5]:
            m.accept(t)
        matchers.append(m)
    batch = C.new_bitmask(len(matchers) + 2, info)
    C.fill_masks(matchers + [None], batch)
    for i, m in enumerate(matchers):
        row = np.zeros(info.n_words, dtype=np.int32)
        m.fill_mask(row)
        np.testing.assert_array_equal(batch[i], row)
    np.testing.assert_array_equal(batch[len(matchers)], info.full_row)  # None: every real token
    assert not batch[-1].any()  # rows past the matchers are left alone
    with pytest.raises(ValueError):
        C.fill_masks(matchers, np.zeros((2, info.n_words), dtype=np.int32))


def test_fill_masks_from_several_python_threads(info, tok):
    """Masks are filled outside the GIL on llguidance's threads; concurrent callers get the
    same masks as a single one."""
    grammar = C.compile_constraint(info, {"type": "json_object"})
    expected = np.zeros((8, info.n_words), dtype=np.int32)
    C.fill_masks([grammar.matcher() for _ in range(8)], expected)
    errors = []

    def work():
        try:
            for _ in range(5):
                b = C.new_bitmask(8, info)
                C.fill_masks([grammar.matcher() for _ in range(8)], b)
                np.testing.assert_array_equal(b, expected)
        except Exception as exc:  # surfaced below
            errors.append(exc)
    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors


# ---------------------------------------------------------------- thinking gate (Qwen3 vocabulary)

@pytest.fixture(scope="module")
def qwen3_info(gguf_md, tmp_path_factory):
    from oracles import build_oracle, write_tokenizer_dir
    oracle = build_oracle(gguf_md, extra_added=[("<tool_response>", 151665), ("</tool_response>", 151666),
                                                ("<think>", 151667), ("</think>", 151668)])
    d = write_tokenizer_dir(gguf_md, oracle, tmp_path_factory.mktemp("qwen3tok"))
    t = Tokenizer.from_dir(d)
    return t, C.TokenizerInfo(t, N_ROWS, EOS)


def test_thinking_gate(qwen3_info):
    t, info = qwen3_info
    think, end = t.token_to_id("<think>"), t.token_to_id("</think>")
    grammar = C.compile_constraint(info, {"type": "regex", "regex": "(yes|no)"})
    g = C.ThinkingGate(grammar.matcher(), "maybe")
    first = set(g.allowed_tokens().tolist())
    assert think in first and t.encode("yes")[0] in first and EOS[1] not in first
    g.accept(think)
    during = set(g.allowed_tokens().tolist())
    assert len(during) > 100000 and EOS[0] not in during and end in during  # unconstrained, no EOS
    for tid in t.encode("hmm, { not json") + [end]:
        g.accept(tid)
    assert g.phase == "answer"
    nl2 = t.encode("\n\n")
    after = set(g.allowed_tokens().tolist())
    assert set(nl2) <= after and not g.can_end()
    for tid in nl2 + t.encode("no"):
        g.accept(tid)
    assert g.can_end() and g.is_terminated()
    # no <think> first: the grammar applies from the first token
    g = C.ThinkingGate(grammar.matcher(), "maybe")
    g.accept(t.encode("yes")[0])
    assert g.phase == "answer" and think not in set(g.allowed_tokens().tolist())
    # in a batch, a thinking row gets the unconstrained mask
    gates = [C.ThinkingGate(grammar.matcher(), "thinking"), C.ThinkingGate(grammar.matcher(), "maybe")]
    b = C.new_bitmask(2, info)
    C.fill_masks(gates, b)
    np.testing.assert_array_equal(b[0], info.thinking_row)
    np.testing.assert_array_equal(C.unpack_bits(b[1], N_ROWS).nonzero()[0], sorted(first))


def test_thinking_phase_of_prompts():
    assert C.thinking_phase("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n") == "maybe"
    assert C.thinking_phase("<|im_start|>assistant\n<think>\n") == "thinking"
    assert C.thinking_phase("<|im_start|>assistant\n<think>\n\n</think>\n\n") == "answer"
    assert C.thinking_phase("<|im_start|>assistant\n<think>x</think>a<|im_end|>\n<|im_start|>assistant\n") == "maybe"


# ---------------------------------------------------------------- generation: a stub model

class StubModel:
    """Logits that always favour EOS (then a fixed preference order): a model that wants to stop."""

    def __init__(self, tok, prefer):
        self.tokenizer, self.n_vocab, self.eos_token_ids = tok, tok.vocab_size, EOS
        self.source, self.config = "stub", type("Cfg", (), {"vocab_size": N_ROWS})()
        self.prefer = [tok.encode(p)[0] for p in prefer]

    def sampling_params(self, **kw):
        from qwenc.engine.sampling import SamplingParams
        return SamplingParams(temperature=0)

    def new_sequence(self):
        class Seq:
            capacity = 10 ** 6

            def __len__(self):
                return 0

            def common_prefix(self, ids):
                return 0

            def truncate(self, n):
                pass
        return Seq()

    def forward(self, seq, ids, **kwargs):
        logits = np.zeros(N_ROWS, dtype=np.float32)
        for rank, t in enumerate(self.prefer):
            logits[t] = 50 - rank
        logits[list(EOS)] = 100
        return logits


def test_eos_waits_for_the_grammar_and_comes_when_it_accepts(tok, info):
    stub = StubModel(tok, ["b", "a", "c"])
    m = C.compile_constraint(info, {"type": "regex", "regex": "a+b*c"}).matcher()
    gen = generate_tokens(stub, [1], max_tokens=20, matcher=m)
    out = []
    try:
        while True:
            out.append(next(gen))
    except StopIteration as end:
        reason = end.value
    # EOS is the favourite but only allowed at the end: "a" (b is not allowed first), "b"s would
    # go on forever, yet EOS is not allowed before "c"... the preference order picks b: up to length
    text = tok.decode(out)
    assert reason == "length" and re.fullmatch("a+b*", text) and len(out) == 20
    # with c preferred over b, the grammar completes, terminates, and generation stops at once
    stub = StubModel(tok, ["c", "a"])
    m = C.compile_constraint(info, {"type": "regex", "regex": "a+b*c?"}).matcher()
    ids = list(generate_tokens(stub, [1], max_tokens=20, matcher=m))
    assert tok.decode(ids) == "a"  # "a" accepts: EOS (the favourite) is then allowed and taken
    unconstrained = list(generate_tokens(stub, [1], max_tokens=20))
    assert unconstrained == []  # without the grammar the stub stops at once


# ---------------------------------------------------------------- generation: random weights, real tokenizer

@pytest.fixture(scope="module")
def model(qwen_tokenizer_dir, tmp_path_factory):
    path, _ = make_model(tmp_path_factory.mktemp("structmodel"), arch="qwen2", dtype="bf16", vocab_size=N_ROWS,
                         hidden_size=64, num_attention_heads=4, num_key_value_heads=2, seed=5)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(qwen_tokenizer_dir / name, path / name)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": list(EOS)}))
    return qwenc.load(path, context=2048)


def closed(schema):
    return {**schema, "additionalProperties": False}


SCHEMAS = {
    "flat object": closed({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 8}, "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"}}, "required": ["name", "count", "ok"]}),
    "optional fields": closed({"type": "object", "properties": {
        "a": {"type": "integer", "minimum": -5, "maximum": 5}, "b": {"type": "string", "maxLength": 4},
        "c": {"type": "null"}}, "required": ["a"]}),
    "nested": closed({"type": "object", "properties": {
        "outer": closed({"type": "object", "properties": {
            "inner": closed({"type": "object", "properties": {"v": {"enum": [1, 2, 3]}}, "required": ["v"]})},
            "required": ["inner"]})}, "required": ["outer"]}),
    "array of enums": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 4},
    "array of objects": {"type": "array", "maxItems": 3, "items": closed({"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 9999}, "label": {"type": "string", "maxLength": 5}},
        "required": ["id"]})},
    "refs and defs": {"$defs": {"point": closed({"type": "object", "properties": {
        "x": {"type": "integer", "minimum": 0, "maximum": 9}, "y": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["x", "y"]})}, "type": "object", "additionalProperties": False,
        "properties": {"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}}, "required": ["from", "to"]},
    "formats": closed({"type": "object", "properties": {
        "day": {"type": "string", "format": "date"}, "at": {"type": "string", "format": "time"},
        "when": {"type": "string", "format": "date-time"}, "id": {"type": "string", "format": "uuid"},
        "ip": {"type": "string", "format": "ipv4"}}, "required": ["day", "at", "when", "id", "ip"]}),
    "pattern and const": closed({"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}, "v": {"const": "1.0"},
        "n": {"type": "number", "minimum": 0, "maximum": 10}}, "required": ["code", "v", "n"]}),
    "anyOf": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 50}, {"type": "string", "maxLength": 3},
                        closed({"type": "object", "properties": {"k": {"type": "boolean"}}, "required": ["k"]})]},
    "recursive tree": {"$defs": {"node": closed({"type": "object", "properties": {
        "v": {"type": "integer", "minimum": 0, "maximum": 9},
        "kids": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]})},
        "$ref": "#/$defs/node"},
}


def _depth(tree):
    return 1 + max((_depth(k) for k in tree.get("kids", ())), default=0)


@pytest.mark.parametrize("name", SCHEMAS)
def test_generated_json_always_validates(model, name):
    schema = SCHEMAS[name]
    v = validator(schema)
    outputs = set()
    for seed in [None, 1, 2, 3]:
        sampling = dict(temperature=0) if seed is None else dict(temperature=1.0, seed=seed)
        gen = Generation(model, model.tokenizer.encode("Output JSON:"), max_tokens=400,
                         constraint={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}},
                         **sampling)
        text = gen.run()
        assert gen.finish_reason == "stop", (seed, text)
        value = json.loads(text)
        errors = list(v.iter_errors(value))
        assert not errors, (seed, text, errors[0].message)
        outputs.add(text)
    assert len(outputs) >= 2  # the seeds really sample different outputs


def test_pydantic_models_through_generate(model):
    for seed in range(4):
        text = model.generate("Person:", json_schema=Person, max_tokens=1500, temperature=1.0, seed=seed)
        person = Person.model_validate_json(text)
        assert 0 <= person.age <= 130 and len(person.name) <= 12


def test_the_validation_oracle_is_not_vacuous(model):
    """Falsifier: the same random model unconstrained (or with the mask switched off) gives
    text that does not parse, so the tests above could fail."""
    for seed in range(3):
        text = model.generate("Output JSON:", max_tokens=40, temperature=1.0, seed=seed)
        with pytest.raises(ValueError):
            json.loads(text)


def test_a_sampler_that_skips_the_mask_is_caught(model, monkeypatch):
    from qwenc.engine import sampling
    monkeypatch.setattr(C.Matcher, "apply", lambda self, logits, row=None: None)
    with pytest.raises(ConstraintViolation):
        for seed in range(3):
            model.generate("x", regex=r"[0-9]{4}", max_tokens=10, temperature=1.0, seed=seed)


@pytest.mark.parametrize("regex", [r"[0-9]{3}-[0-9]{4}", r"(cat|dog|bird)s?", r"[A-Z][a-z]{0,6}( [A-Z][a-z]{0,6})?",
                                   r"-?(0|[1-9][0-9]{0,5})\.[0-9]{2}"])
def test_generated_text_matches_the_regex(model, regex):
    for seed in [None, 1, 2]:
        sampling = dict(temperature=0) if seed is None else dict(temperature=1.0, seed=seed)
        gen = Generation(model, model.tokenizer.encode("x"), max_tokens=60,
                         constraint={"type": "regex", "regex": regex}, **sampling)
        text = gen.run()
        assert gen.finish_reason == "stop" and re.fullmatch(regex, text), (seed, text)


# Nesting bounded (two levels of parentheses), so that a random model's output ends.
ARITH_GBNF = r'''
root   ::= expr
expr   ::= term (("+" | "-") term){0,3}
term   ::= factor (("*" | "/") factor){0,2}
factor ::= num | "(" inner ")"
inner  ::= term2 (("+" | "-") term2){0,2}
term2  ::= num | "(" num ("*" num){0,2} ")"
num    ::= [1-9] [0-9]?
'''
ARITH_LARK = r'''
start: expr
expr: term (("+" | "-") term)~0..3
term: NUM | "(" inner ")"
inner: NUM (("*" | "/") NUM)~0..2
NUM: /[1-9][0-9]?/
'''


@pytest.mark.parametrize("grammar", [ARITH_GBNF, ARITH_LARK], ids=["gbnf", "lark"])
def test_generated_text_parses_with_the_grammar(model, grammar):
    import ast
    ok = 0
    for seed in range(6):
        gen = Generation(model, model.tokenizer.encode("1+1="), max_tokens=200,
                         constraint={"type": "grammar", "grammar": grammar}, temperature=1.0, seed=seed)
        text = gen.run()
        assert gen.finish_reason == "stop", text
        # independent oracle: Python's parser reads it as arithmetic on integer literals only
        tree = ast.parse(text, mode="eval")
        allowed = (ast.Expression, ast.BinOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.Div)
        assert all(isinstance(n, allowed) for n in ast.walk(tree)), text
        assert re.fullmatch(r"[0-9+\-*/()]+", text)
        ok += 1
    assert ok == 6


def test_at_most_one_constraint(model):
    with pytest.raises(InvalidRequest, match="at most one"):
        model.generate("x", regex="a", grammar='root ::= "a"')
    with pytest.raises(InvalidRequest, match="cannot compile"):
        model.generate("x", regex="(")  # refused before any token is generated


# ---------------------------------------------------------------- chat: response_format and tools

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                                           "unit": {"enum": ["c", "f"]}},
                          "required": ["city"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "now", "parameters": {}}}


def test_a_forced_call_may_end_after_a_newline(info, tok):
    """tool_choice "required": the reply may end after its call, or after one newline (where
    Qwen2.5-Coder ends: with the newline allowed only before another call, the demo model was made
    to call again and again until max_tokens); after that newline only another call (parallel
    calls) or the end, never text."""
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    start, text_id, nl = tok.token_to_id("<tool_call>"), tok.encode("Sure")[0], tok.encode("\n")[0]
    for parallel in (True, False):
        spec = C.tool_call_constraint([WEATHER, CLOCK], "required", parallel, info)
        ids, eos = walk(info, tok, spec, call + "\n")
        assert eos[-1] and eos[-2] and not any(eos[:-2])  # the end after the call and after the newline
        m = C.compile_constraint(info, spec).matcher()
        for t in ids:
            m.accept(t)
        allowed = set(m.allowed_tokens().tolist())
        assert text_id not in allowed and nl not in allowed
        assert (start in allowed) == parallel
    ids, eos = walk(info, tok, C.tool_call_constraint([WEATHER, CLOCK], "required", True, info),
                    call + "\n" + call.replace("get_weather", "now").replace('{"city": "Paris"}', "{}"))
    assert eos[-1]


def test_chat_response_format(model):
    messages = [{"role": "user", "content": "Describe a person as JSON."}]
    for seed in range(3):
        out = model.chat(messages, response_format=Address, max_tokens=600, temperature=1.0, seed=seed)
        Address.model_validate_json(out["choices"][0]["message"]["content"])
        assert out["choices"][0]["finish_reason"] == "stop"
    rf = {"type": "json_schema", "json_schema": {"name": "flat", "schema": SCHEMAS["flat object"], "strict": True}}
    out = model.chat(messages, response_format=rf, max_tokens=200, temperature=0)
    validator(SCHEMAS["flat object"]).validate(json.loads(out["choices"][0]["message"]["content"]))
    chunks = list(model.chat(messages, response_format=rf, stream=True, max_tokens=200, temperature=0))
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == out["choices"][0]["message"]["content"]


def test_chat_tool_choice_forces_valid_calls(model):
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    args_ok = validator(WEATHER["function"]["parameters"])
    for seed in range(4):
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            out = model.chat(messages, tools=[WEATHER, CLOCK], tool_choice=choice, max_tokens=300,
                             temperature=1.0, seed=seed)
            choice0 = out["choices"][0]
            msg = choice0["message"]
            assert choice0["finish_reason"] == "tool_calls" and msg["tool_calls"], msg
            assert msg["content"] is None
            for c in msg["tool_calls"]:
                assert c["type"] == "function" and c["id"].startswith("call_")
                if c["function"]["name"] == "get_weather":
                    args_ok.validate(json.loads(c["function"]["arguments"]))
                else:
                    assert choice == "required" and c["function"]["name"] == "now"
                    assert json.loads(c["function"]["arguments"]) == {}
    # parallel_tool_calls=False: exactly one call
    for seed in range(3):
        msg = model.chat(messages, tools=[WEATHER, CLOCK], tool_choice="required", parallel_tool_calls=False,
                         max_tokens=300, temperature=1.0, seed=seed)["choices"][0]["message"]
        assert len(msg["tool_calls"]) == 1
    # streamed: the same calls as deltas, never the markup as content
    kw = dict(tools=[WEATHER], tool_choice="required", max_tokens=300, temperature=1.0, seed=9)
    whole = model.chat(messages, **kw)["choices"][0]["message"]
    chunks = list(model.chat(messages, stream=True, **kw))
    deltas = [c["choices"][0]["delta"] for c in chunks[1:-1]]
    assert all("<tool_call>" not in d.get("content", "") for d in deltas)
    calls = {}
    for d in deltas:
        for tc in d.get("tool_calls", ()):
            entry = calls.setdefault(tc["index"], {"name": tc["function"].get("name"), "arguments": ""})
            entry["arguments"] += tc["function"].get("arguments", "")
    assert [calls[i] for i in sorted(calls)] == [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                                                 for c in whole["tool_calls"]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_chat_tool_options_checked(model):
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(InvalidRequest, match="not among the tools"):
        model.chat(messages, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(InvalidRequest, match="cannot be combined"):
        model.chat(messages, tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"})
    # "none": tools are not offered, and nothing is read as a call
    out = model.chat(messages, tools=[WEATHER], tool_choice="none", max_tokens=5, temperature=0)
    assert "tool_calls" not in out["choices"][0]["message"]


def test_date_patterns_match_pythons_calendar():
    """The date/time patterns that replace the engine's formats accept exactly what Python's
    datetime accepts (every day of leap and common years, century years, days 29-31 of every month)."""
    import datetime
    date = re.compile(C._FORMAT_PATTERNS["date"])
    for year in (1, 4, 100, 400, 1900, 1999, 2000, 2023, 2024, 2100, 9999):
        for month in range(1, 13):
            for day in range(0, 33):
                text = f"{year:04d}-{month:02d}-{day:02d}"
                try:
                    datetime.date.fromisoformat(text)
                    real = True
                except ValueError:
                    real = False
                assert bool(date.fullmatch(text)) == real, text
    assert not date.fullmatch("0000-01-01")
    dt = re.compile(C._FORMAT_PATTERNS["date-time"])
    v = validator({"type": "string", "format": "date-time"})
    for text in ["2024-02-29T23:59:59Z", "2024-02-29T23:59:59.123456+05:30", "2024-01-01T00:00:00-00:00"]:
        assert dt.fullmatch(text) and v.is_valid(text)
    for text in ["2024-01-01t00:00:00z", "2024-01-01T23:59:60Z", "2024-01-01T24:00:00Z", "2024-01-01T00:00:00"]:
        assert not dt.fullmatch(text)
