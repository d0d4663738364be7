"""Qwen2 / Qwen2.5 / Qwen3 tokenizer: byte-level BPE with the merge loop and pre-tokenizer in C.

Encoding, as Qwen's `tokenizer.json` defines it:
1. Added tokens (`<|im_start|>`, `<tool_call>`, ...) are split out of the raw text whole, longest
   match first at the leftmost position.
2. Each remaining piece is NFC-normalized and cut by the split pattern QWEN2_PATTERN (letters
   with one leading non-letter, digits one at a time, punctuation runs, whitespace runs that
   leave their last space to the next word).
3. Each piece's UTF-8 bytes are merged by BPE, best-ranked merge first.

Decoding concatenates the tokens' raw bytes and decodes them as UTF-8, bad bytes becoming U+FFFD.

Unicode versions: the pattern's letter/number/space classes are Unicode 16.0 (csrc/bpe.c), the
classes of the regex engine inside HF `tokenizers`, checked on every code point by the tests.
NFC comes from Python's `unicodedata` (Unicode 14.0 on Python 3.11). HF's NFC data is older
(it acts as Unicode 13): the two differ only where one of the combining marks new in Unicode 14
(e.g. U+0898..U+089F) precedes a mark of a lower combining class, which they reorder differently.

A Tokenizer may be shared between threads: the C calls hold the GIL.
"""
from __future__ import annotations

import json
import os
import re
import unicodedata
from typing import Iterable, Optional

import numpy as np

from .. import _bpe
from ..errors import TokenizerError, UnsupportedTokenizer
from ..formats.jsonfile import read_json

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Added tokens that Qwen ships with special=false (GGUF files mark the FIM ones "control").
QWEN_NON_SPECIAL = frozenset([
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
    "<think>", "</think>", "<tool_response>", "</tool_response>",  # Qwen3
])
QWEN_SPECIAL = frozenset([
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
])

# GGUF tokenizer.ggml.token_type values.
GGUF_NORMAL, GGUF_UNKNOWN, GGUF_CONTROL, GGUF_USER_DEFINED, GGUF_UNUSED, GGUF_BYTE = 1, 2, 3, 4, 5, 6


def _byte_alphabet() -> list:
    """Byte -> character of the byte-level alphabet: printable Latin-1 bytes stand for
    themselves, the other 68 take U+0100, U+0101, ... in byte order."""
    chars, extra = [], 256
    for b in range(256):
        if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or b >= 0xAE:
            chars.append(chr(b))
        else:
            chars.append(chr(extra))
            extra += 1
    return chars


_BYTE_CHAR = _byte_alphabet()
_CHAR_BYTE = {c: b for b, c in enumerate(_BYTE_CHAR)}


def _as_byte_level(content: str) -> str:
    """An added token's text, rewritten so that the byte-level decoder yields the bytes the
    reference decoder gives it: its characters mapped back to bytes when all of them are in the
    alphabet, else its UTF-8 text."""
    if all(c in _CHAR_BYTE for c in content):
        return content
    return "".join(_BYTE_CHAR[b] for b in content.encode("utf-8"))


def _literal_regex(contents: Iterable[str]):
    """Regex finding any of `contents`, the longest one where several start at the same place."""
    alts = sorted({c for c in contents if c}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, alts))) if alts else None


# Fill-in-the-middle: the marks around a prefix and a suffix, and what a model may write when
# the middle is done besides EOS (the repository-level markers: as llama.cpp ends them).
FIM_MARKS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
FIM_ENDS = ("<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")


class Tokenizer:
    """Byte-level BPE tokenizer with Qwen's pipeline. Build it with from_file / from_dir /
    from_gguf_metadata."""

    def __init__(self, tokens: list, in_vocab: bytes, merges: list, added: list, *, nfc: bool = True,
                 ignore_merges: bool = False, eos_token_id: Optional[int] = None,
                 pad_token_id: Optional[int] = None, source: str = "tokenizer"):
        """tokens: token string (byte-level alphabet) per id, None for ids that are no token.
        in_vocab: one byte per id, nonzero for the BPE model's own vocabulary.
        merges: "left right" strings, best first.
        added: (content, id, special, normalized) tuples.
        source: where it was read from, for error messages."""
        n = len(tokens)
        if not 0 < n < 2**31:
            raise TokenizerError(f"{source}: a vocabulary of {n} tokens")
        kinds = bytearray(n)
        for i, t in enumerate(tokens):
            if t is not None:
                kinds[i] = _bpe.KIND_PLAIN
        strings = list(tokens)
        self._added, self._special_ids = {}, set()
        raw_added, normalized_added = [], []
        for content, tid, special, normalized in added:
            if not 0 <= tid < n:
                raise TokenizerError(f"{source}: added token {content!r} has id {tid} outside the "
                                     f"vocabulary"[:300])
            self._added[content] = tid
            strings[tid] = content
            kinds[tid] = _bpe.KIND_SPECIAL if special else _bpe.KIND_PLAIN
            if special:
                self._special_ids.add(tid)
            (normalized_added if normalized else raw_added).append(content)
        self._tokens = strings
        self._raw_re = _literal_regex(raw_added)
        self._normalized_re = _literal_regex(normalized_added)
        self._nfc = nfc
        self._token_ids = None  # token string -> id, built on first token_to_id
        self._vocab_size = sum(1 for k in kinds if k)
        self._is_token = np.frombuffer(bytes(kinds), np.uint8) != 0  # ids that are no token: False
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.chat_template = None  # a ChatTemplate, set by the loader when the model has one

        blob_strings = [("" if t is None else t) for t in tokens]
        for content, tid, _, _ in added:
            if not in_vocab[tid]:
                try:
                    blob_strings[tid] = _as_byte_level(content)
                except UnicodeEncodeError:  # lone surrogates: bytes that were not UTF-8 in a GGUF
                    raise TokenizerError(f"{source}: added token {tid} is not valid UTF-8") from None
        blob = "\n".join(blob_strings)
        if blob.count("\n") != n - 1:
            raise UnsupportedTokenizer(f"{source}: a vocabulary token contains a raw newline character")
        merge_blob = "\n".join(merges)
        if len(merges) and merge_blob.count("\n") != len(merges) - 1:
            raise TokenizerError(f"{source}: a merge contains a newline character")
        try:
            blob_bytes, merge_bytes = blob.encode("utf-8"), merge_blob.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: bytes that were not UTF-8 in a GGUF
            raise TokenizerError(f"{source}: a token or merge is not valid UTF-8") from None
        try:
            self._bpe = _bpe.BPE(blob_bytes, n, bytes(in_vocab), bytes(kinds), merge_bytes, len(merges),
                                 ignore_merges)
        except ValueError as exc:  # what the C loader refuses: a merge of unknown tokens, a missing byte
            raise TokenizerError(f"{source}: {exc}") from None

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, tools=None,
                            **template_kwargs) -> str:
        """The conversation rendered with the model's chat template, as transformers'
        apply_chat_template(..., tokenize=False) renders it (note: add_generation_prompt defaults
        to True here, since the usual next step is generating the assistant's turn)."""
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                         **template_kwargs)

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    def from_gguf_metadata(cls, md: dict, source: str = "GGUF metadata") -> "Tokenizer":
        """From GGUF metadata (key -> value), as Qwen ships the tokenizer: NFC, the Qwen2 split
        pattern, byte-level BPE, and the added tokens with Qwen's own special flags."""
        model, pre = md.get("tokenizer.ggml.model"), md.get("tokenizer.ggml.pre")
        if model != "gpt2":
            raise UnsupportedTokenizer(f"{source}: GGUF tokenizer model {model!r}: only byte-level BPE "
                                       "('gpt2')"[:300])
        if pre != "qwen2":
            raise UnsupportedTokenizer(f"{source}: GGUF pre-tokenizer {pre!r}: only Qwen's ('qwen2') is "
                                       "implemented"[:300])
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
            if key not in md:
                raise TokenizerError(f"{source}: GGUF metadata lacks {key}")
            if not isinstance(md[key], list) or not all(isinstance(t, str) for t in md[key]):
                raise TokenizerError(f"{source}: {key} is not an array of strings")
        tokens = list(md["tokenizer.ggml.tokens"])
        n = len(tokens)
        types = md.get("tokenizer.ggml.token_type")
        if types is None:
            types = np.full(n, GGUF_NORMAL, np.int64)
        elif not isinstance(types, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                    and 0 <= t < 2**31 for t in types):
            raise TokenizerError(f"{source}: tokenizer.ggml.token_type is not an array of token types")
        else:
            types = np.asarray(types, dtype=np.int64).reshape(-1)
        if types.shape != (n,):
            raise TokenizerError(f"{source}: tokenizer.ggml.token_type does not have one entry per token")
        if md.get("tokenizer.ggml.token_type") is None:  # no types: recognise Qwen's added tokens
            for i, t in enumerate(tokens):
                if t in QWEN_SPECIAL or t in QWEN_NON_SPECIAL:
                    types[i] = GGUF_CONTROL
        added_mask = (types == GGUF_CONTROL) | (types == GGUF_USER_DEFINED)
        in_vocab = np.isin(types, (GGUF_NORMAL, GGUF_UNKNOWN, GGUF_BYTE))
        for i in np.flatnonzero(types == GGUF_UNUSED):
            tokens[i] = None  # llama.cpp's [PAD...] fillers up to the padded size
        added = []
        for i in np.flatnonzero(added_mask).tolist():
            content = tokens[i]
            special = types[i] == GGUF_CONTROL and content not in QWEN_NON_SPECIAL
            added.append((content, i, bool(special), False))
        ids = {}
        for name in ("eos", "padding"):
            value = md.get(f"tokenizer.ggml.{name}_token_id")
            if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < n):
                raise TokenizerError(f"{source}: tokenizer.ggml.{name}_token_id {value!r} is not a token id"[:300])
            ids[name] = value
        return cls(tokens, in_vocab.astype(np.uint8).tobytes(), list(md["tokenizer.ggml.merges"]), added,
                   nfc=True, eos_token_id=ids["eos"], pad_token_id=ids["padding"], source=source)

    @classmethod
    def from_file(cls, path) -> "Tokenizer":
        """From a HuggingFace tokenizer.json. Pipelines other than Qwen's raise UnsupportedTokenizer
        (a NotImplementedError); a malformed file raises TokenizerError."""
        return cls._from_spec(read_json(path, TokenizerError), source=str(path))

    @classmethod
    def from_dir(cls, model_dir) -> Optional["Tokenizer"]:
        """From model_dir/tokenizer.json (eos/pad from tokenizer_config.json), or None when absent."""
        path = os.path.join(model_dir, "tokenizer.json")
        if not os.path.isfile(path):
            return None
        tok = cls.from_file(path)
        config_path = os.path.join(model_dir, "tokenizer_config.json")
        if os.path.isfile(config_path):
            config = read_json(config_path, TokenizerError)
            tok.eos_token_id = tok._config_token_id(config.get("eos_token"))
            tok.pad_token_id = tok._config_token_id(config.get("pad_token"))
        return tok

    def _config_token_id(self, entry):
        if isinstance(entry, dict):
            entry = entry.get("content")
        return self.token_to_id(entry) if isinstance(entry, str) else None

    @classmethod
    def _from_spec(cls, spec: dict, source: str = "tokenizer.json") -> "Tokenizer":
        if not isinstance(spec, dict):
            raise TokenizerError(f"{source}: expected a JSON object")
        for key in ("normalizer", "pre_tokenizer", "decoder", "post_processor", "model"):
            if spec.get(key) is not None and not isinstance(spec[key], dict):
                raise TokenizerError(f"{source}: '{key}' must be an object, got {spec[key]!r}"[:300])
        nfc = _check_normalizer(spec.get("normalizer"), source)
        _check_pre_tokenizer(spec.get("pre_tokenizer"), source)
        decoder = spec.get("decoder")
        if not decoder or decoder.get("type") != "ByteLevel":
            raise UnsupportedTokenizer(f"{source}: decoder {decoder!r}: only ByteLevel is implemented"[:300])
        post = spec.get("post_processor")
        if post is not None and post.get("type") != "ByteLevel":
            raise UnsupportedTokenizer(f"{source}: post-processor {post.get('type')!r}: only none or "
                                       "ByteLevel"[:300])
        if spec.get("truncation"):
            raise UnsupportedTokenizer(f"{source}: truncation is not implemented")
        model = spec.get("model") or {}
        _check_model(model, source)

        vocab, added_specs = model.get("vocab"), spec.get("added_tokens")
        added_specs = [] if added_specs is None else added_specs
        if not isinstance(vocab, dict) or not vocab:
            raise TokenizerError(f"{source}: model.vocab must be a non-empty object of token -> id")
        if not isinstance(added_specs, list):
            raise TokenizerError(f"{source}: added_tokens must be an array")
        for t, i in vocab.items():
            if not isinstance(i, int) or isinstance(i, bool) or i < 0:
                raise TokenizerError(f"{source}: vocabulary token {t!r} has id {i!r}, not an id"[:300])
        added = []
        for a in added_specs:
            if not (isinstance(a, dict) and isinstance(a.get("content"), str) and isinstance(a.get("id"), int)
                    and not isinstance(a.get("id"), bool) and a["id"] >= 0):
                raise TokenizerError(f"{source}: added token {a!r} needs a string 'content' and an id"[:300])
            for option in ("lstrip", "rstrip", "single_word"):
                if a.get(option):
                    raise UnsupportedTokenizer(f"{source}: added token {a['content']!r} uses {option}"[:300])
            added.append((a["content"], a["id"], bool(a.get("special")), bool(a.get("normalized"))))
        entries = len(vocab) + len(added)
        n = 1 + max(max(vocab.values()), max((a[1] for a in added), default=-1))
        # Ids may leave gaps, but an id far past the entries would only allocate: refuse it.
        if n > 2 * entries + 1024:
            raise TokenizerError(f"{source}: token ids run to {n - 1} for {entries} tokens")
        tokens, in_vocab = [None] * n, bytearray(n)
        for t, i in vocab.items():
            if tokens[i] is not None:
                raise TokenizerError(f"{source}: id {i} belongs to two tokens, {tokens[i]!r} and {t!r}"[:300])
            tokens[i] = t
            in_vocab[i] = 1
        merges = model.get("merges") or []
        if not isinstance(merges, list):
            raise TokenizerError(f"{source}: model.merges must be an array")
        if merges and not isinstance(merges[0], str):
            if not all(isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m) for m in merges):
                raise TokenizerError(f"{source}: model.merges must be strings or pairs of strings")
            merges = [f"{a} {b}" for a, b in merges]
        elif not all(isinstance(m, str) for m in merges):
            raise TokenizerError(f"{source}: model.merges must be strings or pairs of strings")
        return cls(tokens, bytes(in_vocab), merges, added, nfc=nfc,
                   ignore_merges=bool(model.get("ignore_merges")), source=source)

    # ---- encoding ----------------------------------------------------------------------------
    def encode(self, text: str, allow_special: bool = True) -> list:
        """Token ids of `text`. With allow_special=False, special-token text is ordinary text
        (non-special added tokens such as <tool_call> are still recognised)."""
        if not isinstance(text, str):
            raise TypeError(f"encode() needs a str, not {type(text).__name__}")
        if self._raw_re is None or self._raw_re.search(text) is None:  # the common case
            return self._encode_piece(text, allow_special)
        ids = []
        for piece, tid in self._split_added(text, self._raw_re, allow_special):
            if tid is None:
                ids += self._encode_piece(piece, allow_special)
            else:
                ids.append(tid)
        return ids

    def _encode_piece(self, text: str, allow_special: bool) -> list:
        """Ids of text that holds no raw (unnormalized) added token."""
        if self._nfc:
            text = unicodedata.normalize("NFC", text)  # returns at once when already NFC
        if self._normalized_re is None:
            return self._bpe.encode(text.encode("utf-8"))
        ids = []
        for piece, tid in self._split_added(text, self._normalized_re, allow_special):
            if tid is None:
                ids += self._bpe.encode(piece.encode("utf-8"))
            else:
                ids.append(tid)
        return ids

    def _split_added(self, text: str, pattern, allow_special: bool):
        """(text, None) and (None, id) pieces: `text` cut around the added tokens that
        `pattern` finds. A special token found while specials are off stays in the text."""
        start = 0
        for m in pattern.finditer(text):
            tid = self._added[m.group()]
            if not allow_special and tid in self._special_ids:
                continue
            if m.start() > start:
                yield text[start:m.start()], None
            yield None, tid
            start = m.end()
        if start < len(text):
            yield text[start:], None

    def fill_in_middle(self, prefix, suffix) -> tuple:
        """A fill-in-the-middle prompt (Qwen2.5-Coder's format: prefix, suffix, then the middle
        to write) and the tokens that end the middle besides EOS: (ids, end ids). `prefix` and
        `suffix` are text (read as code: special-token text in them stays text) or token ids.
        Raises InvalidRequest when the vocabulary has no FIM tokens."""
        from ..errors import InvalidRequest
        marks = [self._added.get(t) for t in FIM_MARKS]
        if None in marks:
            raise InvalidRequest("this model's vocabulary has no fill-in-the-middle tokens "
                                 f"({', '.join(FIM_MARKS)}): a suffix cannot be given")

        def ids(part, what):
            if isinstance(part, str):
                return self.encode(part, allow_special=False)
            if isinstance(part, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in part):
                return list(part)
            raise InvalidRequest(f"a fill-in-the-middle {what} must be text or token ids")
        ends = [self._added[t] for t in FIM_ENDS if t in self._added]
        return [marks[0]] + ids(prefix, "prefix") + [marks[1]] + ids(suffix, "suffix") + [marks[2]], ends

    # ---- decoding ----------------------------------------------------------------------------
    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """Text of a token sequence; invalid UTF-8 becomes U+FFFD. Raises IndexError for an id
        that is no token."""
        return self._bpe.decode(ids, skip_special_tokens)

    def decode_bytes(self, ids, skip_special_tokens: bool = False) -> bytes:
        """Raw bytes of a token sequence."""
        return self._bpe.decode_bytes(ids, skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token (an added token: its UTF-8 text)."""
        return self._bpe.token_bytes(token_id)

    # ---- vocabulary --------------------------------------------------------------------------
    def token_to_id(self, token: str) -> Optional[int]:
        """Id of a token string (byte-level form for ordinary tokens), or None."""
        tid = self._added.get(token)
        if tid is not None:
            return tid
        if self._token_ids is None:
            self._token_ids = {t: i for i, t in enumerate(self._tokens) if t is not None}
        return self._token_ids.get(token)

    def id_to_token(self, token_id: int) -> str:
        """Token string of an id (byte-level form for ordinary tokens)."""
        if not isinstance(token_id, (int, np.integer)) or isinstance(token_id, bool):
            raise TypeError(f"token id must be an int, not {type(token_id).__name__}")
        if not 0 <= token_id < len(self._tokens) or self._tokens[token_id] is None:
            raise IndexError(f"token id {token_id} is not a token of this vocabulary")
        return self._tokens[token_id]

    def first_non_token(self, ids):
        """The first of `ids` that is no token of this vocabulary (out of range, or a gap such as
        a padded embedding row), or None when every one is a token."""
        a = np.asarray(ids, dtype=np.int64).reshape(-1)
        ok = (a >= 0) & (a < len(self._is_token))
        ok[ok] = self._is_token[a[ok]]
        return None if ok.all() else int(a[np.argmin(ok)])

    @property
    def vocab_size(self) -> int:
        """Number of real tokens, added ones included (not the model's padded embedding size)."""
        return self._vocab_size

    @property
    def id_count(self) -> int:
        """One past the largest id (ids that are no token included): the embedding rows it needs."""
        return len(self._tokens)

    @property
    def special_ids(self) -> frozenset:
        return frozenset(self._special_ids)

    @property
    def added_tokens(self) -> dict:
        """Added token text -> id."""
        return dict(self._added)


# ---- tokenizer.json checks: refuse what is not implemented rather than tokenize wrong ---------
def _check_normalizer(spec, source="tokenizer.json", depth=0) -> bool:
    """True for NFC, False for none; UnsupportedTokenizer for anything else."""
    if spec is None:
        return False
    if not isinstance(spec, dict) or depth > 8:
        raise TokenizerError(f"{source}: malformed normalizer {spec!r}"[:300])
    kind = spec.get("type")
    if kind == "NFC":
        return True
    if kind == "Sequence":
        parts = spec.get("normalizers", [])
        if not isinstance(parts, list):
            raise TokenizerError(f"{source}: normalizer Sequence needs a list of normalizers")
        return any([_check_normalizer(s, source, depth + 1) for s in parts])
    raise UnsupportedTokenizer(f"{source}: normalizer {kind!r}: only NFC (or none) is implemented"[:300])


def _check_pre_tokenizer(spec, source="tokenizer.json"):
    parts = spec.get("pretokenizers") if isinstance(spec, dict) and spec.get("type") == "Sequence" else None
    ok = isinstance(parts, list) and len(parts) == 2 and all(isinstance(p, dict) for p in parts)
    if ok:
        split, byte_level = parts
        ok = (split.get("type") == "Split" and split.get("pattern") == {"Regex": QWEN2_PATTERN}
              and split.get("behavior") == "Isolated" and not split.get("invert")
              and byte_level.get("type") == "ByteLevel" and not byte_level.get("add_prefix_space")
              and not byte_level.get("use_regex"))
    if not ok:
        raise UnsupportedTokenizer(f"{source}: pre-tokenizer: only Qwen's Sequence[Split(QWEN2_PATTERN, "
                                   "Isolated), ByteLevel(add_prefix_space=False, use_regex=False)] is "
                                   f"implemented, got {spec!r}"[:400])


def _check_model(model: dict, source="tokenizer.json"):
    if model.get("type") != "BPE":
        raise UnsupportedTokenizer(f"{source}: model {model.get('type')!r}: only BPE is implemented"[:300])
    if model.get("dropout"):
        raise UnsupportedTokenizer(f"{source}: BPE dropout is not implemented")
    for option in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(option):
            raise UnsupportedTokenizer(f"{source}: BPE {option} is not implemented")
