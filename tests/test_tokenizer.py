"""Tokenizer parity with HuggingFace `tokenizers`, built from the demo GGUF the way Qwen ships it.

The oracle: `tokenizers`' BPE model from the GGUF vocab and merges, an NFC normalizer, a Split
pre-tokenizer with Qwen2's pattern (isolated) then ByteLevel without prefix space or regex, a
ByteLevel decoder, and the 22 added tokens with Qwen's own special flags. qwenc's tokenizer is
built twice, from the GGUF metadata and from the oracle saved as tokenizer.json, and both must
give the oracle's ids on every corpus string. Falsifiers show the suite tells wrong variants
apart (no look-ahead rule, no NFC, merges in the wrong order).
"""
import copy
import json
import time
import random
import unicodedata
from pathlib import Path

import numpy as np
import pytest

tokenizers = pytest.importorskip("tokenizers")
gguf = pytest.importorskip("gguf")

import qwenc  # noqa: E402
from qwenc import _bpe  # noqa: E402
from qwenc.text.tokenizer import QWEN2_PATTERN, QWEN_NON_SPECIAL, Tokenizer  # noqa: E402
from oracles import build_oracle  # noqa: E402

CORPUS_PATH = Path(__file__).parent / "data" / "tokenizer_corpus.jsonl"
N_REAL = 151665  # 151643 BPE tokens + 22 added; the GGUF pads to 151936


# ---- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def oracle(gguf_md):
    return build_oracle(gguf_md)


@pytest.fixture(scope="session")
def tok(gguf_md):
    return Tokenizer.from_gguf_metadata(gguf_md)


@pytest.fixture(scope="session")
def spec_dir(qwen_tokenizer_dir):
    """The oracle saved as tokenizer.json, with a tokenizer_config.json naming eos and pad."""
    return qwen_tokenizer_dir


@pytest.fixture(scope="session")
def spec(spec_dir):
    return json.loads((spec_dir / "tokenizer.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def tok_json(spec_dir):
    return Tokenizer.from_file(spec_dir / "tokenizer.json")


@pytest.fixture(scope="session", params=["gguf", "json"])
def any_tok(request, tok, tok_json):
    return tok if request.param == "gguf" else tok_json


@pytest.fixture(scope="session")
def corpus():
    text = CORPUS_PATH.read_text(encoding="utf-8")
    return [json.loads(line) for line in text.split("\n") if line]


def oracle_ids(oracle, s, allow_special=True):
    oracle.encode_special_tokens = not allow_special
    try:
        return oracle.encode(s, add_special_tokens=False).ids
    finally:
        oracle.encode_special_tokens = False


def report(bad, total, what):
    shown = "\n".join(repr(s)[:160] for s in bad[:5])
    return f"{len(bad)} of {total} strings: {what}\n{shown}"


# ---- the corpus itself ------------------------------------------------------------------------
def test_corpus_covers_the_hard_cases(corpus):
    assert len(corpus) >= 1000
    assert "" in corpus
    assert max(len(s) for s in corpus) >= 100_000
    joined = "".join(s for s in corpus if len(s) < 100_000)
    for needle in ["<|im_start|>", "\u200d", "\U0001F3FD", "\r\n", "\u00a0", "\u3000", "'LL", "'S", "\t",
                   "\ufffd", "\u0301", "你", "\u0627", "\u0928", "\u0e2a", "\u0416", "\uc548", "https://"]:
        assert needle in joined, needle
    assert any(s != unicodedata.normalize("NFC", s) for s in corpus), "needs NFD strings"
    assert any(ord(c) > 0xE0000 for c in joined), "needs code points from the high planes"


# ---- encoding ---------------------------------------------------------------------------------
def test_encode_matches_oracle(any_tok, oracle, corpus):
    bad = [s for s in corpus if any_tok.encode(s) != oracle_ids(oracle, s)]
    assert not bad, report(bad, len(corpus), "ids differ from the oracle")


def test_encode_with_specials_as_text_matches_oracle(any_tok, oracle, corpus):
    bad = [s for s in corpus if any_tok.encode(s, allow_special=False) != oracle_ids(oracle, s, False)]
    assert not bad, report(bad, len(corpus), "ids differ with allow_special=False")


def test_specials_as_text(tok):
    assert tok.encode("<|im_end|>") == [151645]
    plain = tok.encode("<|im_end|>", allow_special=False)
    assert 151645 not in plain and len(plain) > 1
    # non-special added tokens stay whole either way, as in the reference
    assert tok.encode("<tool_call>", allow_special=False) == [tok.token_to_id("<tool_call>")]


def test_fill_in_middle_prompt_is_the_oracles_encoding(any_tok, oracle, corpus):
    from qwenc.text.tokenizer import FIM_ENDS, FIM_MARKS
    cases = [("def f(x):\n    ", "\n    return y\n"), ("", "tail"), ("head", ""), ("a <b> c", " <|endoftext|> x")]
    cases += [(corpus[i], corpus[-1 - i]) for i in range(0, 40, 4)]
    for prefix, suffix in cases:
        ids, ends = any_tok.fill_in_middle(prefix, suffix)
        marks = [oracle.token_to_id(t) for t in FIM_MARKS]
        assert ids == [marks[0]] + oracle_ids(oracle, prefix, False) + [marks[1]] + \
            oracle_ids(oracle, suffix, False) + [marks[2]]
        assert ends == [oracle.token_to_id(t) for t in FIM_ENDS]
        if "<|" not in prefix + suffix:  # special-token text aside, the literal prompt string is the same
            assert ids == oracle_ids(oracle, f"{FIM_MARKS[0]}{prefix}{FIM_MARKS[1]}{suffix}{FIM_MARKS[2]}")
    assert any_tok.fill_in_middle([1, 2], "x")[0][1:3] == [1, 2]
    with pytest.raises(qwenc.InvalidRequest):
        any_tok.fill_in_middle(3.5, "x")


def test_fill_in_middle_needs_the_tokens(spec):
    spec = copy.deepcopy(spec)
    spec["added_tokens"] = [t for t in spec["added_tokens"] if "fim_" not in t["content"]]
    for t in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>"):
        spec["model"]["vocab"].pop(t, None)
    with pytest.raises(qwenc.InvalidRequest, match="fill-in-the-middle"):
        Tokenizer._from_spec(spec).fill_in_middle("a", "b")


def test_encoding_lets_other_threads_run_and_is_thread_safe(tok, oracle, corpus):
    """A long prompt is encoded without the GIL (the server's other streams go on meanwhile), and
    encodes from many threads at once give what one thread gives."""
    import threading
    from concurrent.futures import ThreadPoolExecutor
    text = "x = 1\n" + " " * 1_500_000 + "y"  # one long whitespace run: a slow pretoken, about a second
    go, done, result = threading.Event(), threading.Event(), {}

    def encode():
        go.wait()
        t0 = time.perf_counter()
        result["ids"] = tok.encode(text)
        result["took"] = time.perf_counter() - t0
        done.set()
    worker = threading.Thread(target=encode)
    worker.start()
    go.set()
    last = time.perf_counter()
    longest = 0.0
    while not done.is_set():
        time.sleep(0.001)
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    worker.join()
    assert longest < result["took"] / 3, f"the main thread stalled {longest:.3f} s of a {result['took']:.3f} s encode"
    assert result["ids"] == oracle_ids(oracle, text)
    texts = corpus[:60]
    serial = [tok.encode(t) for t in texts]
    with ThreadPoolExecutor(6) as pool:
        assert list(pool.map(tok.encode, texts * 4)) == serial * 4


def _byte_alphabet():
    chars, extra = [], 256
    for b in range(256):
        if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or b >= 0xAE:
            chars.append(chr(b))
        else:
            chars.append(chr(extra))
            extra += 1
    return chars


BYTE_CHARS = _byte_alphabet()


def to_byte_level(raw: bytes) -> str:
    """Bytes in the byte-level alphabet that HF pre-tokenizers output."""
    return "".join([BYTE_CHARS[b] for b in raw])


def test_pretokenizer_pieces_match_oracle(tok, oracle, corpus):
    """The split pattern alone, on text without added tokens (sharper failures than ids)."""
    bad = []
    for s in corpus:
        if "<" in s and ">" in s:
            continue
        text = unicodedata.normalize("NFC", s)
        ours = [to_byte_level(p) for p in tok._bpe.pretokenize(text.encode("utf-8"))]
        ref = [p for p, _ in oracle.pre_tokenizer.pre_tokenize_str(text)]
        if ours != ref:
            bad.append(s)
    assert not bad, report(bad, len(corpus), "pre-tokens differ")


def test_contraction_case_folding_matches_oracle(tok, oracle):
    """(?i:'s|'t|'re|'ve|'m|'ll|'d) under Unicode case folding: try every cased character (and a
    sample of the rest) in each letter slot of the contractions (U+017F LONG S folds to 's')."""
    every = [chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    cased = [c for c in every if c.lower() != c or c.upper() != c or c.casefold() != c]
    cps = cased + random.Random(5).sample(every, 20000)
    for template in ["'{}", "'{}e", "'r{}", "'l{}"]:
        text = "\n".join(template.format(c) for c in cps)
        ours = [to_byte_level(p) for p in tok._bpe.pretokenize(text.encode("utf-8"))]
        ref = [p for p, _ in oracle.pre_tokenizer.pre_tokenize_str(text)]
        assert ours == ref, template


def test_unicode_classes_match_oracle_regex_engine(tok):
    """\\p{L}, \\p{N} and \\s as the reference regex engine sees them, on every code point."""
    from tokenizers import Regex, pre_tokenizers

    cps = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    text = "".join(map(chr, cps))
    for pattern, bit in [(r"\p{L}+", 1), (r"\p{N}+", 2), (r"\s+", 4)]:  # bits of char_class
        in_class = np.ones(len(cps), bool)
        split = pre_tokenizers.Split(Regex(pattern), behavior="removed")
        for _, (a, b) in split.pre_tokenize_str(text):  # what survives removal is outside the class
            in_class[a:b] = False
        ours = np.array([bool(_bpe.char_class(c) & bit) for c in cps])
        wrong = np.flatnonzero(ours != in_class)
        assert wrong.size == 0, f"{pattern}: {wrong.size} code points differ, e.g. " + \
            ", ".join(f"U+{cps[i]:04X}" for i in wrong[:10])


# ---- decoding ---------------------------------------------------------------------------------
def test_decode_matches_oracle(any_tok, oracle, corpus):
    bad = []
    for s in corpus:
        ids = oracle_ids(oracle, s)
        for skip in (False, True):
            if any_tok.decode(ids, skip_special_tokens=skip) != oracle.decode(ids, skip_special_tokens=skip):
                bad.append(s)
    assert not bad, report(bad, len(corpus), "decode differs from the oracle")


def test_roundtrip_is_nfc(tok, corpus):
    bad = [s for s in corpus if tok.decode(tok.encode(s)) != unicodedata.normalize("NFC", s)]
    assert not bad, report(bad, len(corpus), "decode(encode(s)) != NFC(s)")


def random_id_sequences(tok, corpus, n=3000, seed=7):
    """Id sequences a decoder must survive: random ids, lone high-byte tokens, and slices of
    real encodings that cut multi-byte characters apart."""
    rng = random.Random(seed)
    byte_tokens = [tok.token_to_id(to_byte_level(bytes([b]))) for b in range(256)]
    added = sorted(tok.added_tokens.values())
    multibyte = [s for s in corpus if any(ord(c) > 0x7F for c in s) and len(s) < 2000]
    out = []
    for _ in range(n):
        kind = rng.randrange(4)
        if kind == 0:
            seq = [rng.randrange(N_REAL) for _ in range(rng.randint(0, 12))]
        elif kind == 1:
            seq = [rng.choice(byte_tokens) for _ in range(rng.randint(1, 8))]
        elif kind == 2:
            ids = tok.encode(rng.choice(multibyte))
            a = rng.randrange(len(ids) + 1)
            seq = ids[a:a + rng.randint(1, 6)]
        else:
            ids = tok.encode(rng.choice(multibyte))
            seq = [x for x in ids if rng.random() < 0.7] + [rng.choice(added)]
            rng.shuffle(seq)
        out.append(seq)
    return out


def test_decode_arbitrary_ids_matches_oracle(any_tok, tok, oracle, corpus):
    seqs = random_id_sequences(tok, corpus)
    assert any("\ufffd" in oracle.decode(s, skip_special_tokens=False) for s in seqs)
    bad = [s for s in seqs for skip in (False, True)
           if any_tok.decode(s, skip_special_tokens=skip) != oracle.decode(s, skip_special_tokens=skip)]
    assert not bad, f"{len(bad)} id sequences decode differently, e.g. {bad[:3]}"


def test_token_bytes_of_every_token(tok, oracle):
    """Each token's bytes decode as the oracle decodes that token alone; decode of a sequence is
    the UTF-8 decoding of its tokens' bytes joined (what a streaming detokenizer relies on)."""
    bad = [i for i in range(N_REAL)
           if tok.token_bytes(i).decode("utf-8", "replace") != oracle.decode([i], skip_special_tokens=False)]
    assert not bad, f"{len(bad)} tokens differ, e.g. {bad[:10]}"
    assert tok.token_bytes(151644) == b"<|im_start|>"
    assert tok.token_bytes(220) == b" "
    ids = tok.encode("héllo 你好 🙂")
    assert tok.decode_bytes(ids) == b"".join(tok.token_bytes(i) for i in ids)


def test_skip_special_tokens(tok, oracle):
    ids = tok.encode("<|im_start|>user\n<tool_call>x</tool_call><|fim_prefix|><|im_end|><|endoftext|>")
    assert tok.decode(ids, skip_special_tokens=True) == "user\n<tool_call>x</tool_call><|fim_prefix|>"
    assert tok.decode(ids, skip_special_tokens=True) == oracle.decode(ids, skip_special_tokens=True)
    assert tok.decode(ids) == oracle.decode(ids, skip_special_tokens=False)


def test_decode_accepts_numpy_and_tuples(tok):
    ids = tok.encode("numpy ids")
    assert tok.decode(np.array(ids, dtype=np.int32)) == "numpy ids"
    assert tok.decode(tuple(ids)) == "numpy ids"
    assert tok.decode(iter(ids)) == "numpy ids"
    assert tok.decode([]) == ""


# ---- the vocabulary surface -------------------------------------------------------------------
def test_vocabulary_surface(any_tok, oracle):
    assert any_tok.vocab_size == oracle.get_vocab_size(with_added_tokens=True) == N_REAL
    specials = {i for i in range(151643, N_REAL) if oracle.id_to_token(i) not in QWEN_NON_SPECIAL}
    assert any_tok.special_ids == frozenset(specials) and len(specials) == 14
    assert any_tok.added_tokens == {oracle.id_to_token(i): i for i in range(151643, N_REAL)}
    rng = random.Random(3)
    for i in rng.sample(range(N_REAL), 2000) + list(range(151643, N_REAL)):
        token = oracle.id_to_token(i)
        assert any_tok.id_to_token(i) == token
        assert any_tok.token_to_id(token) == i
    assert any_tok.token_to_id("no such token here") is None


def test_special_ids_from_metadata(tok, tok_json, spec_dir):
    assert (tok.eos_token_id, tok.pad_token_id) == (151645, 151643)
    assert tok_json.eos_token_id is None  # a bare tokenizer.json does not name them
    from_dir = Tokenizer.from_dir(spec_dir)
    assert (from_dir.eos_token_id, from_dir.pad_token_id) == (151645, 151643)


def test_from_dir_without_tokenizer_json(tmp_path):
    assert Tokenizer.from_dir(tmp_path) is None


def test_qwen3_added_tokens(gguf_md, corpus):
    """Qwen3's vocabulary adds <tool_response>, </tool_response>, <think>, </think> at
    151665..151668 (user-defined in GGUF files): added, whole, non-special."""
    extra = ["<tool_response>", "</tool_response>", "<think>", "</think>"]
    md = dict(gguf_md)
    md["tokenizer.ggml.tokens"] = list(md["tokenizer.ggml.tokens"])
    md["tokenizer.ggml.token_type"] = list(md["tokenizer.ggml.token_type"])
    for k, content in enumerate(extra):
        md["tokenizer.ggml.tokens"][N_REAL + k] = content
        md["tokenizer.ggml.token_type"][N_REAL + k] = 4
    q3 = Tokenizer.from_gguf_metadata(md)
    ref = build_oracle(gguf_md, [(c, N_REAL + k) for k, c in enumerate(extra)])
    assert q3.vocab_size == N_REAL + 4
    assert all(q3.token_to_id(c) == N_REAL + k for k, c in enumerate(extra))
    assert not q3.special_ids & set(range(N_REAL, N_REAL + 4))
    text = "<|im_start|>assistant\n<think>\nLet me think.\n</think>\n\n<tool_response>ok</tool_response><|im_end|>"
    ids = q3.encode(text)
    assert ids == ref.encode(text, add_special_tokens=False).ids
    assert N_REAL + 2 in ids
    assert q3.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)
    sample = corpus[::7]
    assert [q3.encode(s) for s in sample] == [ref.encode(s, add_special_tokens=False).ids for s in sample]


# ---- other tokenizer.json options the loader claims to handle ---------------------------------
def hf_from_spec(spec):
    return tokenizers.Tokenizer.from_str(json.dumps(spec))


def test_normalized_added_tokens(spec, corpus):
    """Added tokens with normalized=true are matched after NFC, on the normalized text."""
    changed = dict(spec, added_tokens=[dict(a, normalized=not a["special"]) for a in spec["added_tokens"]])
    ours, ref = Tokenizer._from_spec(changed), hf_from_spec(changed)
    sample = [s for s in corpus if "<" in s] + ["<tool_call>\u0338", "<tool_call>x"]
    bad = [s for s in sample if ours.encode(s) != ref.encode(s, add_special_tokens=False).ids]
    assert not bad, report(bad, len(sample), "normalized added tokens differ")


def test_ignore_merges(spec, corpus):
    changed = dict(spec, model=dict(spec["model"], ignore_merges=True))
    ours, ref = Tokenizer._from_spec(changed), hf_from_spec(changed)
    bad = [s for s in corpus if ours.encode(s) != ref.encode(s, add_special_tokens=False).ids]
    assert not bad, report(bad, len(corpus), "ignore_merges differs")


def test_merges_as_string_pairs(spec):
    changed = dict(spec, model=dict(spec["model"], merges=[f"{a} {b}" for a, b in spec["model"]["merges"]]))
    text = "Pairs or strings, the merges are the same.\n  def f(): return 42"
    assert Tokenizer._from_spec(changed).encode(text) == hf_from_spec(spec).encode(text).ids


@pytest.mark.parametrize("change", [
    {"normalizer": {"type": "NFKC"}},
    {"normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]}},
    {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}},
    {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\s+|\S+"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}},
    {"decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True}},
    {"post_processor": {"type": "TemplateProcessing", "single": [], "pair": [], "special_tokens": {}}},
    {"truncation": {"max_length": 8, "strategy": "LongestFirst", "stride": 0, "direction": "Right"}},
    {"model": {"type": "WordPiece", "vocab": {}}},
    {"model": "continuing_subword_prefix"},
    {"added_tokens": "lstrip"},
], ids=lambda c: next(iter(c)) + ":" + str(next(iter(c.values())))[:30])
def test_refuses_what_it_does_not_implement(spec, change):
    changed = dict(spec)
    if change == {"model": "continuing_subword_prefix"}:
        changed["model"] = dict(spec["model"], continuing_subword_prefix="##")
    elif change == {"added_tokens": "lstrip"}:
        changed["added_tokens"] = [dict(a, lstrip=True) for a in spec["added_tokens"]]
    else:
        changed.update(copy.deepcopy(change))
    with pytest.raises(NotImplementedError):
        Tokenizer._from_spec(changed)


@pytest.mark.parametrize("key,value", [("tokenizer.ggml.pre", "llama-bpe"), ("tokenizer.ggml.model", "llama")])
def test_refuses_other_gguf_tokenizers(gguf_md, key, value):
    with pytest.raises(NotImplementedError):
        Tokenizer.from_gguf_metadata(dict(gguf_md, **{key: value}))


# ---- bad input --------------------------------------------------------------------------------
def test_bad_input_raises_cleanly(tok):
    for bad in (None, b"bytes", 42, ["a"]):
        with pytest.raises(TypeError):
            tok.encode(bad)
    with pytest.raises(ValueError):
        tok.encode("lone surrogate \ud800")
    for ids in ([-1], [N_REAL], [151935], [10 ** 30], [1, 2, 151700]):
        with pytest.raises(IndexError):
            tok.decode(ids)
    for bad_id in ("x", 1.5, None):
        with pytest.raises(TypeError):
            tok.decode([bad_id])
        with pytest.raises(TypeError):
            tok.token_bytes(bad_id)
    with pytest.raises(TypeError):
        tok.decode(None)
    for i in (-1, N_REAL, 151935, 10 ** 30):
        with pytest.raises(IndexError):
            tok.token_bytes(i)
        with pytest.raises(IndexError):
            tok.id_to_token(i)


# ---- falsifiers: wrong variants must disagree with the oracle --------------------------------
def count_mismatches(tokenizer, oracle, corpus):
    return sum(tokenizer.encode(s) != oracle_ids(oracle, s) for s in corpus)


@pytest.mark.parametrize("flag", [_bpe.FLAG_NO_LOOKAHEAD, _bpe.FLAG_LEFT_TO_RIGHT],
                         ids=["no-lookahead-rule", "merges-left-to-right"])
def test_falsifier_variants_disagree(gguf_md, oracle, corpus, flag):
    wrong = Tokenizer.from_gguf_metadata(gguf_md)
    wrong._bpe.set_flags(flag)
    assert count_mismatches(wrong, oracle, corpus) > 50


def test_falsifier_without_nfc_disagrees(spec, oracle, corpus):
    wrong = Tokenizer._from_spec(dict(spec, normalizer=None))
    assert wrong._nfc is False
    assert count_mismatches(wrong, oracle, corpus) > 20
