"""TextStream: streamed text equals the decoded whole cut before the stop string; nothing leaks."""
import random

import pytest

from qwenc.text.textstream import TextStream, unfinished_utf8_tail


class FakeTokenizer:
    """Token ids map to arbitrary byte strings; a few ids are special tokens."""

    def __init__(self, vocab=None, special=None):
        self.vocab = dict(vocab or {})
        self.special_ids = set()
        for token_id, data in (special or {}).items():
            self.vocab[token_id] = data
            self.special_ids.add(token_id)

    def token_bytes(self, token_id):
        return self.vocab[token_id]

    def ids(self, *pieces):
        """Ids for byte strings, adding any not yet in the vocabulary."""
        by_bytes = {v: k for k, v in self.vocab.items() if k not in self.special_ids}
        out = []
        for piece in pieces:
            piece = piece.encode() if isinstance(piece, str) else piece
            if piece not in by_bytes:
                by_bytes[piece] = len(self.vocab) + 10_000
                self.vocab[by_bytes[piece]] = piece
            out.append(by_bytes[piece])
        return out


def run(tokenizer, ids, **kwargs):
    stream = TextStream(tokenizer, **kwargs)
    pieces = [stream.push(i) for i in ids]
    return stream, pieces, stream.finish()


def expected_output(text, stops):
    """The reference rule, on the whole text: the stop completing first wins; among those
    completing at the same character, the one starting earliest."""
    best = None
    for stop in stops:
        start = text.find(stop)
        if start >= 0 and (best is None or (start + len(stop), start) < best[0]):
            best = ((start + len(stop), start), stop)
    return (text, None) if best is None else (text[:best[0][1]], best[1])


# --------------------------------------------------------------------------------------------
# UTF-8
# --------------------------------------------------------------------------------------------

def test_character_split_over_tokens_is_held_until_complete():
    tok = FakeTokenizer()
    data = "你好".encode()  # 6 bytes: e4 bd a0 e5 a5 bd
    stream, pieces, tail = run(tok, tok.ids(data[:1], data[1:2], data[2:4], data[4:]))
    assert pieces == ["", "", "你", "好"] and tail == ""


def test_emoji_split_four_ways():
    tok = FakeTokenizer()
    data = "a🐍b".encode()
    stream, pieces, tail = run(tok, tok.ids(*[data[i:i + 1] for i in range(len(data))]))
    assert pieces == ["a", "", "", "", "🐍", "b"] and stream.text == "a🐍b"


def test_invalid_bytes_become_replacement_like_bytes_decode():
    tok = FakeTokenizer()
    cases = [
        [b"\xff", b"a"],                 # never valid: replaced at once
        [b"\xe4\xb8", b"a"],             # truncated 3-byte sequence, then ASCII
        [b"\xe4", b"\xb8", b"\xe4\xb8\xad"],  # truncated sequence, then a complete one
        [b"\xc0\xaf", b"x"],             # overlong encoding
        [b"\xed\xa0", b"\x80"],          # a surrogate
        [b"\x80\x80"],                   # lone continuation bytes
        [b"ok\xf0\x9f"],                 # incomplete at the very end: flushed by finish()
    ]
    for parts in cases:
        stream, pieces, tail = run(tok, tok.ids(*parts))
        assert "".join(pieces) + tail == b"".join(parts).decode("utf-8", "replace"), parts
    stream, pieces, tail = run(tok, tok.ids(b"\xff", b"a"))
    assert pieces == ["\ufffd", "a"]
    stream, pieces, tail = run(tok, tok.ids(b"ok\xf0\x9f"))
    assert pieces == ["ok"] and tail == "\ufffd"


def _proper_prefixes_of_utf8_characters():
    # Stepping by 64 still visits every distinct proper prefix: the last byte varies fastest.
    prefixes = set()
    for cp in range(0x80, 0x110000, 64):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        encoded = chr(cp).encode()
        prefixes.update(encoded[:k] for k in range(1, len(encoded)))
    return prefixes


UNFINISHED = _proper_prefixes_of_utf8_characters()
EDGE_BYTES = [0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF,
              0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF]


def _byte_sequences():
    import itertools

    for n in (1, 2, 3):
        yield from (bytes(seq) for seq in itertools.product(EDGE_BYTES, repeat=n))
    rng = random.Random(3)
    for _ in range(5000):
        yield bytes(rng.choices(EDGE_BYTES, k=rng.randint(4, 7)))


def test_only_a_valid_unfinished_character_is_held():
    for buf in _byte_sequences():
        longest = max((k for k in (1, 2, 3) if buf[-k:] in UNFINISHED and k <= len(buf)),
                      default=0)
        assert unfinished_utf8_tail(buf) == longest, buf


def test_byte_by_byte_streaming_matches_bytes_decode():
    tok = FakeTokenizer({b: bytes([b]) for b in range(256)})
    for buf in _byte_sequences():
        stream = TextStream(tok)
        for n, b in enumerate(buf):
            stream.push(b)
            so_far = buf[:n + 1].decode("utf-8", "replace")
            # Released at once unless the tail may still complete (one U+FFFD if cut now).
            assert so_far in (stream.text, stream.text + "\ufffd"), buf[:n + 1]
        stream.finish()
        assert stream.text == buf.decode("utf-8", "replace"), buf


# --------------------------------------------------------------------------------------------
# Stop strings
# --------------------------------------------------------------------------------------------

def test_stop_string_spanning_tokens_never_leaks():
    tok = FakeTokenizer()
    stream, pieces, tail = run(tok, tok.ids("Hel", "lo W", "orld", "!"), stop_strings=["o Wor"])
    assert pieces == ["Hel", "l", "", ""] and tail == ""
    assert stream.stopped and stream.stop_string == "o Wor" and stream.text == "Hell"


def test_held_prefix_is_released_when_it_turns_out_not_to_be_a_stop():
    tok = FakeTokenizer()
    stream, pieces, tail = run(tok, tok.ids("a<|im", "_start"), stop_strings=["<|im_end|>"])
    assert pieces == ["a", "<|im_start"] and not stream.stopped
    stream, pieces, tail = run(tok, tok.ids("x<|i"), stop_strings=["<|im_end|>"])
    assert pieces == ["x"] and tail == "<|i"  # finish() releases a prefix that never completed


def test_stop_string_with_multibyte_characters_split_in_bytes():
    tok = FakeTokenizer()
    data = "答案：42".encode()
    parts = [data[i:i + 2] for i in range(0, len(data), 2)]
    stream, pieces, tail = run(tok, tok.ids(*parts), stop_strings=["：4"])
    assert "".join(pieces) + tail == "答案" and stream.stop_string == "：4"


def test_tie_rule_same_end_earliest_start_wins():
    tok = FakeTokenizer()
    stream, _, _ = run(tok, tok.ids("xa", "bc", "d"), stop_strings=["bc", "abc"])
    assert stream.text == "x" and stream.stop_string == "abc"


def test_tie_rule_same_start_shortest_completes_first():
    tok = FakeTokenizer()
    stream, _, _ = run(tok, tok.ids("x", "abc"), stop_strings=["abc", "ab"])
    assert stream.text == "x" and stream.stop_string == "ab"


def test_stop_inside_a_longer_stop_fires_first():
    # The stream stops the moment "bc" completes; it cannot wait to see whether "abcd" will.
    tok = FakeTokenizer()
    stream, pieces, tail = run(tok, tok.ids("xab", "c", "d"), stop_strings=["abcd", "bc"])
    assert stream.text == "xa" and stream.stop_string == "bc"


def test_several_stops_in_one_token_earliest_wins():
    tok = FakeTokenizer()
    stream, pieces, _ = run(tok, tok.ids("one END two STOP"), stop_strings=["STOP", "END"])
    assert pieces == ["one "] and stream.stop_string == "END"


def test_after_stop_and_after_finish():
    tok = FakeTokenizer()
    stream = TextStream(tok, stop_strings="\n\n")  # a single string is one stop string
    assert stream.push(tok.ids("a\n")[0]) == "a"
    assert stream.push(tok.ids("\nb")[0]) == ""
    assert stream.stopped and stream.push(tok.ids("c")[0]) == "" and stream.finish() == ""
    with pytest.raises(RuntimeError):
        stream.push(tok.ids("c")[0])
    with pytest.raises(ValueError):
        TextStream(tok, stop_strings=["ok", ""])


# --------------------------------------------------------------------------------------------
# Special tokens
# --------------------------------------------------------------------------------------------

EOT = 1


def test_special_tokens_skipped_or_kept():
    tok = FakeTokenizer(special={EOT: b"<|eot|>"})
    ids = tok.ids("hi ") + [EOT] + tok.ids("there")
    assert run(tok, ids)[0].text == "hi there"
    assert run(tok, ids, skip_special_tokens=False)[0].text == "hi <|eot|>there"


def test_skipped_special_token_does_not_break_a_split_character():
    # Like decode(skip_special_tokens=True): the special token is removed, then bytes decode.
    tok = FakeTokenizer(special={EOT: b"<|eot|>"})
    data = "é".encode()
    ids = tok.ids(data[:1]) + [EOT] + tok.ids(data[1:])
    assert run(tok, ids)[0].text == "é"
    assert run(tok, ids, skip_special_tokens=False)[0].text == "\ufffd<|eot|>\ufffd"


def test_special_token_text_is_never_split_across_pieces():
    tok = FakeTokenizer(special={EOT: b"<|eot|>"})
    ids = tok.ids("a") + [EOT] + tok.ids("b")
    stream, pieces, tail = run(tok, ids, stop_strings=["|>z"], skip_special_tokens=False)
    # "|>" could start "|>z", but holding it would split "<|eot|>": the whole token waits.
    assert pieces == ["a", "", "<|eot|>b"] and tail == ""


# --------------------------------------------------------------------------------------------
# Randomized: tokens are random byte slices of random text (splitting characters), with
# invalid bytes, special tokens and stop strings across token boundaries
# --------------------------------------------------------------------------------------------

ALPHABET = list("abc xyz<|>:\n") + list("éüß") + list("你好世界") + ["🐍", "🙂"]
JUNK = [b"\xff", b"\x80", b"\xe4\xb8", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf0\x9f"]
SPECIALS = {1: b"<|eot|>", 2: b"<|x|>"}


def random_case(rng):
    chunks = []
    for _ in range(rng.randint(1, 40)):
        roll = rng.random()
        if roll < 0.08:
            chunks.append(rng.choice(JUNK))
        elif roll < 0.15:
            chunks.append(rng.choice(list(SPECIALS)))  # an int marks a special token
        else:
            chunks.append("".join(rng.choices(ALPHABET, k=rng.randint(1, 4))).encode())
    tok = FakeTokenizer(special=SPECIALS)
    ids = []
    for chunk in chunks:
        if isinstance(chunk, int):
            ids.append(chunk)
            continue
        pos = 0
        while pos < len(chunk):  # random cut points, often inside a character
            step = rng.randint(1, 5)
            ids += tok.ids(chunk[pos:pos + step])
            pos += step
    return tok, ids


def decoded(tok, ids, skip):
    return b"".join(tok.token_bytes(i) for i in ids
                    if not (skip and i in tok.special_ids)).decode("utf-8", "replace")


def random_stops(rng, text):
    stops = []
    for _ in range(rng.randint(0, 3)):
        if text and rng.random() < 0.7:
            start = rng.randrange(len(text))
            stops.append(text[start:start + rng.randint(1, 6)])  # occurs, spans tokens
        else:
            stops.append("".join(rng.choices(ALPHABET, k=rng.randint(1, 4))))
    if stops and rng.random() < 0.3:
        stops.append(stops[0][:-1] or stops[0])  # a stop that is a prefix of another
    return stops


@pytest.mark.parametrize("skip", [True, False])
def test_randomized_invariants(skip):
    rng = random.Random(1234 + skip)
    n_stopped = 0
    for _ in range(600):
        tok, ids = random_case(rng)
        full = decoded(tok, ids, skip)
        stops = random_stops(rng, full)
        want, want_stop = expected_output(full, stops)
        # Where special tokens' text sits in the decoded text, to check it is never split.
        spans = []
        if not skip:
            for n, i in enumerate(ids):
                if i in tok.special_ids:
                    start = len(decoded(tok, ids[:n], skip))
                    spans.append((start, start + len(tok.token_bytes(i).decode())))

        stream = TextStream(tok, stop_strings=stops, skip_special_tokens=skip)
        for n, i in enumerate(ids):
            stream.push(i)
            emitted = stream.text
            # Nothing released can belong to the stop string or what follows it.
            assert want.startswith(emitted), (ids, stops)
            # A piece boundary never falls inside a special token's text (but a stop may).
            if not stream.stopped:
                assert not any(s < len(emitted) < e for s, e in spans), (ids, stops)
                # Liveness: only a possible stop prefix, a special token's text, or incomplete
                # UTF-8 (one U+FFFD when decoded now) is held back.
                so_far = decoded(tok, ids[:n + 1], skip)
                rest = so_far[len(emitted):]
                options = {rest, rest[:-1] if rest.endswith("\ufffd") else rest}
                assert any(r == "" or any(s.startswith(r) and len(r) < len(s) for s in stops)
                           or any(r.startswith(t.decode()) for t in SPECIALS.values())
                           for r in options), (ids, stops, rest)
        stream.finish()
        assert stream.text == want, (ids, stops)
        assert stream.stop_string == want_stop and stream.stopped == (want_stop is not None)
        n_stopped += stream.stopped
    assert n_stopped > 150  # the stop-string paths were really exercised


def test_reference_rule_is_earliest_start_when_no_stop_contains_another():
    # The rule above is "first occurrence in the text" whenever no stop string occurs strictly
    # inside another: check that on random cases, to pin down what the rule means.
    rng = random.Random(7)
    checked = 0
    for _ in range(2000):
        text = "".join(rng.choices("abc", k=12))
        stops = ["".join(rng.choices("abc", k=rng.randint(1, 4))) for _ in range(3)]
        if any(a != b and a in b[1:-1] for a in stops for b in stops):
            continue
        occurrences = [(text.find(s), len(s), s) for s in stops if s in text]
        got, _ = expected_output(text, stops)
        if occurrences:
            assert got == text[:min(occurrences)[0]]
            checked += 1
    assert checked > 200


def test_random_cases_really_split_characters():
    # Decoding token by token must go wrong on these cases, or they would prove nothing.
    rng = random.Random(99)
    broken = 0
    for _ in range(200):
        tok, ids = random_case(rng)
        naive = "".join(tok.token_bytes(i).decode("utf-8", "replace") for i in ids)
        broken += naive != decoded(tok, ids, skip=False)
    assert broken > 100
