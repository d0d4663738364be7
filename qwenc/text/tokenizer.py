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


class Tokenizer:
    """Byte-level BPE tokenizer with Qwen's pipeline. Build it with from_file / from_dir /
    from_gguf_metadata."""

    def __init__(self, tokens: list, in_vocab: bytes, merges: list, added: list, *, nfc: bool = True,
                 ignore_merges: bool = False, eos_token_id: Optional[int] = None,
                 pad_token_id: Optional[int] = None):
        """tokens: token string (byte-level alphabet) per id, None for ids that are no token.
        in_vocab: one byte per id, nonzero for the BPE model's own vocabulary.
        merges: "left right" strings, best first.
        added: (content, id, special, normalized) tuples."""
        n = len(tokens)
        kinds = bytearray(n)
        for i, t in enumerate(tokens):
            if t is not None:
                kinds[i] = _bpe.KIND_PLAIN
        strings = list(tokens)
        self._added, self._special_ids = {}, set()
        raw_added, normalized_added = [], []
        for content, tid, special, normalized in added:
            if not 0 <= tid < n:
                raise ValueError(f"added token {content!r} has id {tid} outside the vocabulary")
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
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.chat_template = None  # a ChatTemplate, set by the loader when the model has one

        blob_strings = [("" if t is None else t) for t in tokens]
        for content, tid, _, _ in added:
            if not in_vocab[tid]:
                blob_strings[tid] = _as_byte_level(content)
        blob = "\n".join(blob_strings)
        if blob.count("\n") != n - 1:
            raise NotImplementedError("a vocabulary token contains a raw newline character")
        merge_blob = "\n".join(merges)
        if len(merges) and merge_blob.count("\n") != len(merges) - 1:
            raise ValueError("a merge contains a newline character")
        self._bpe = _bpe.BPE(blob.encode("utf-8"), n, bytes(in_vocab), bytes(kinds),
                             merge_blob.encode("utf-8"), len(merges), ignore_merges)

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
    def from_gguf_metadata(cls, md: dict) -> "Tokenizer":
        """From GGUF metadata (key -> value), as Qwen ships the tokenizer: NFC, the Qwen2 split
        pattern, byte-level BPE, and the added tokens with Qwen's own special flags."""
        model, pre = md.get("tokenizer.ggml.model"), md.get("tokenizer.ggml.pre")
        if model != "gpt2":
            raise NotImplementedError(f"GGUF tokenizer model {model!r}: only byte-level BPE ('gpt2')")
        if pre != "qwen2":
            raise NotImplementedError(f"GGUF pre-tokenizer {pre!r}: only Qwen's ('qwen2') is implemented")
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
            if key not in md:
                raise ValueError(f"GGUF metadata lacks {key}")
        tokens = list(md["tokenizer.ggml.tokens"])
        n = len(tokens)
        types = md.get("tokenizer.ggml.token_type")
        types = np.full(n, GGUF_NORMAL, np.int64) if types is None else np.asarray(types).astype(np.int64)
        if types.shape != (n,):
            raise ValueError("tokenizer.ggml.token_type does not have one entry per token")
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
        eos = md.get("tokenizer.ggml.eos_token_id")
        pad = md.get("tokenizer.ggml.padding_token_id")
        return cls(tokens, in_vocab.astype(np.uint8).tobytes(), list(md["tokenizer.ggml.merges"]), added,
                   nfc=True, eos_token_id=None if eos is None else int(eos),
                   pad_token_id=None if pad is None else int(pad))

    @classmethod
    def from_file(cls, path) -> "Tokenizer":
        """From a HuggingFace tokenizer.json. Pipelines other than Qwen's raise NotImplementedError."""
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
        return cls._from_spec(spec)

    @classmethod
    def from_dir(cls, model_dir) -> Optional["Tokenizer"]:
        """From model_dir/tokenizer.json (eos/pad from tokenizer_config.json), or None when absent."""
        path = os.path.join(model_dir, "tokenizer.json")
        if not os.path.isfile(path):
            return None
        tok = cls.from_file(path)
        config_path = os.path.join(model_dir, "tokenizer_config.json")
        if os.path.isfile(config_path):
            with open(config_path, encoding="utf-8") as f:
                config = json.load(f)
            tok.eos_token_id = tok._config_token_id(config.get("eos_token"))
            tok.pad_token_id = tok._config_token_id(config.get("pad_token"))
        return tok

    def _config_token_id(self, entry):
        if isinstance(entry, dict):
            entry = entry.get("content")
        return self.token_to_id(entry) if isinstance(entry, str) else None

    @classmethod
    def _from_spec(cls, spec: dict) -> "Tokenizer":
        nfc = _check_normalizer(spec.get("normalizer"))
        _check_pre_tokenizer(spec.get("pre_tokenizer"))
        decoder = spec.get("decoder")
        if not decoder or decoder.get("type") != "ByteLevel":
            raise NotImplementedError(f"decoder {decoder!r}: only ByteLevel is implemented")
        post = spec.get("post_processor")
        if post is not None and post.get("type") != "ByteLevel":
            raise NotImplementedError(f"post-processor {post.get('type')!r}: only none or ByteLevel")
        if spec.get("truncation"):
            raise NotImplementedError("truncation is not implemented")
        model = spec.get("model") or {}
        _check_model(model)

        vocab, added_specs = model["vocab"], spec.get("added_tokens") or []
        n = 1 + max(max(vocab.values(), default=-1), max((a["id"] for a in added_specs), default=-1))
        tokens, in_vocab = [None] * n, bytearray(n)
        for t, i in vocab.items():
            tokens[i] = t
            in_vocab[i] = 1
        added = []
        for a in added_specs:
            for option in ("lstrip", "rstrip", "single_word"):
                if a.get(option):
                    raise NotImplementedError(f"added token {a['content']!r} uses {option}")
            added.append((a["content"], a["id"], bool(a.get("special")), bool(a.get("normalized"))))
        merges = model.get("merges") or []
        if merges and not isinstance(merges[0], str):
            merges = [f"{a} {b}" for a, b in merges]
        return cls(tokens, bytes(in_vocab), merges, added, nfc=nfc,
                   ignore_merges=bool(model.get("ignore_merges")))

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

    @property
    def vocab_size(self) -> int:
        """Number of real tokens, added ones included (not the model's padded embedding size)."""
        return self._vocab_size

    @property
    def special_ids(self) -> frozenset:
        return frozenset(self._special_ids)

    @property
    def added_tokens(self) -> dict:
        """Added token text -> id."""
        return dict(self._added)


# ---- tokenizer.json checks: refuse what is not implemented rather than tokenize wrong ---------
def _check_normalizer(spec) -> bool:
    """True for NFC, False for none; NotImplementedError for anything else."""
    if spec is None:
        return False
    kind = spec.get("type")
    if kind == "NFC":
        return True
    if kind == "Sequence":
        parts = [_check_normalizer(s) for s in spec.get("normalizers", [])]
        return any(parts)
    raise NotImplementedError(f"normalizer {kind!r}: only NFC (or none) is implemented")


def _check_pre_tokenizer(spec):
    parts = spec.get("pretokenizers") if spec and spec.get("type") == "Sequence" else None
    ok = parts is not None and len(parts) == 2
    if ok:
        split, byte_level = parts
        ok = (split.get("type") == "Split" and split.get("pattern") == {"Regex": QWEN2_PATTERN}
              and split.get("behavior") == "Isolated" and not split.get("invert")
              and byte_level.get("type") == "ByteLevel" and not byte_level.get("add_prefix_space")
              and not byte_level.get("use_regex"))
    if not ok:
        raise NotImplementedError("pre-tokenizer: only Qwen's Sequence[Split(QWEN2_PATTERN, Isolated), "
                                  f"ByteLevel(add_prefix_space=False, use_regex=False)] is implemented, got {spec!r}"[:400])


def _check_model(model: dict):
    if model.get("type") != "BPE":
        raise NotImplementedError(f"model {model.get('type')!r}: only BPE is implemented")
    if model.get("dropout"):
        raise NotImplementedError("BPE dropout is not implemented")
    for option in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(option):
            raise NotImplementedError(f"BPE {option} is not implemented")
