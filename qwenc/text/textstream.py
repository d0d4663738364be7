"""Incremental detokenization for streaming: token ids in, safe-to-show text out.

Two things make the naive "decode each token and print it" wrong:

- A byte-level BPE token is a run of bytes, not of characters: one character of Chinese or an
  emoji is often split over two or three tokens. Text is released only once its UTF-8 is
  complete; bytes that can never complete become U+FFFD exactly where
  `all_bytes.decode("utf-8", errors="replace")` would put them.
- A stop string can arrive split over tokens ("<|im" + "_end|>", "\\n\\nUser" + ":"). Text is
  released only once it can no longer be the start of a stop string, so a stop string never
  leaks its first characters; when one completes, everything from its start on is dropped.

When is a stop string found? At the first character that completes any of them. If several
complete at that same character (e.g. "bc" and "abc" in "abc"), the one starting earliest wins.
This equals "the earliest-starting occurrence in the text" whenever no stop string occurs
strictly inside another; when one does (stops "bc" and "abcd" on "abcd"), the stream has
already stopped at "bc": it cannot wait for tokens it should not generate.

The tokenizer only needs `token_bytes(id) -> bytes` and `special_ids` (a set of ids).
"""
from __future__ import annotations

# Allowed range of the second byte after these lead bytes (everything else: 80..BF). Outside it
# the sequence is an overlong form, a surrogate or beyond U+10FFFF, so it can never complete.
_SECOND_BYTE = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}


def _sequence_length(lead: int) -> int:
    """Bytes in the UTF-8 sequence this byte starts; 0 when it cannot start a multi-byte one."""
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return 0


def unfinished_utf8_tail(buf: bytes) -> int:
    """How many trailing bytes of `buf` are the valid start of a character still to come.

    Those are the only bytes worth waiting for. Everything before them decodes now, and to the
    same text as it would inside the whole byte string: a complete or invalid sequence ends
    there, so the decoder restarts at the held lead byte either way. Bytes that can never
    complete (a bad second byte, a stray continuation byte) are not held: they become U+FFFD
    at once, as `bytes.decode("utf-8", "replace")` would make them.
    """
    n = len(buf)
    start = n - 1
    while start >= max(n - 3, 0) and 0x80 <= buf[start] <= 0xBF:
        start -= 1  # back over continuation bytes to the lead byte (at most 3 back)
    if start < max(n - 3, 0):
        return 0
    lead, have = buf[start], n - start
    if have >= _sequence_length(lead):
        return 0  # complete, or not a multi-byte lead at all
    if have >= 2:
        low, high = _SECOND_BYTE.get(lead, (0x80, 0xBF))
        if not low <= buf[start + 1] <= high:
            return 0
    return have


class TextStream:
    """Feed generated token ids with `push`; show what it returns; call `finish` at the end.

    The concatenation of every `push` result and `finish()` equals the UTF-8 decoding (with
    replacement) of all the pushed tokens' bytes, cut before the stop string that fired.
    Special tokens contribute nothing when `skip_special_tokens` is set; otherwise their text is
    released whole, never split across two pieces (unless a stop string starts inside it).
    """

    def __init__(self, tokenizer, stop_strings=(), skip_special_tokens: bool = True):
        if isinstance(stop_strings, str):
            stop_strings = (stop_strings,)  # one stop string, not one per character
        self.stop_strings = tuple(stop_strings)
        for stop in self.stop_strings:
            if not isinstance(stop, str) or not stop:
                raise ValueError(f"stop strings must be non-empty strings, got {stop!r}")
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stopped = False           # a stop string completed; nothing more is released
        self.stop_string = None        # which one
        self.finished = False          # finish() was called
        self._bytes = b""              # an unfinished UTF-8 character's first bytes
        self._held = ""                # decoded, not yet released text
        self._special_spans = []       # (start, end) of special tokens' text inside _held
        self._pieces = []              # everything released, in order
        self._longest_stop = max((len(s) for s in self.stop_strings), default=0)

    @property
    def text(self) -> str:
        """Everything released so far."""
        return "".join(self._pieces)

    @property
    def held_text(self) -> str:
        """Decoded text kept back: it could still begin a stop string (or it is a special
        token's text that such a hold would otherwise split)."""
        return self._held

    def push(self, token_id) -> str:
        """Add one generated token; return the text that became safe to show (maybe "")."""
        if self.finished:
            raise RuntimeError("push() after finish(): start a new TextStream")
        if self.stopped:
            return ""
        special = token_id in self.tokenizer.special_ids
        if special and self.skip_special_tokens:
            return ""
        token = self.tokenizer.token_bytes(token_id)
        data = self._bytes + token
        keep = unfinished_utf8_tail(data)
        self._bytes = data[len(data) - keep:]
        self._held += data[:len(data) - keep].decode("utf-8", errors="replace")
        if special:
            self._mark_special(token)
        return self._release(final=False)

    def finish(self) -> str:
        """End of generation: release what is held, decoding incomplete bytes as U+FFFD."""
        if self.finished:
            return ""
        self.finished = True
        if self.stopped:
            return ""
        self._held += self._bytes.decode("utf-8", errors="replace")
        self._bytes = b""
        return self._release(final=True)

    # -- internals ---------------------------------------------------------------------------

    def _mark_special(self, data: bytes):
        # A special token's bytes are complete UTF-8 starting on a character boundary, so
        # whatever unfinished bytes came before it were flushed as U+FFFD and its text is now
        # the tail of _held. A malformed one gets no atomicity, only correct decoding.
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return
        if text and not self._bytes and self._held.endswith(text):
            self._special_spans.append((len(self._held) - len(text), len(self._held)))

    def _release(self, final: bool) -> str:
        found = self._first_stop()
        if found is not None:
            start, stop = found
            self.stopped, self.stop_string = True, stop
            return self._emit(start, drop_rest=True)
        cut = len(self._held) if final else len(self._held) - self._stop_prefix_len()
        for start, end in self._special_spans:
            if start < cut < end:
                cut = start  # never split a special token's text
        return self._emit(cut, drop_rest=False)

    def _first_stop(self):
        """(start, stop) of the stop string completing first in _held, or None.

        Text already released can never begin a stop string (it was held while it could), so
        searching _held alone is enough, and any match found here completed in the last push.
        """
        best = None
        for stop in self.stop_strings:
            start = self._held.find(stop)
            if start >= 0:
                key = (start + len(stop), start)  # completes first, then starts earliest
                if best is None or key < best[0]:
                    best = (key, stop)
        return None if best is None else (best[0][1], best[1])

    def _stop_prefix_len(self) -> int:
        """Length of the longest suffix of _held that is a proper prefix of a stop string."""
        for k in range(min(len(self._held), self._longest_stop - 1), 0, -1):
            tail = self._held[-k:]
            if any(stop.startswith(tail) for stop in self.stop_strings):
                return k
        return 0

    def _emit(self, cut: int, drop_rest: bool) -> str:
        piece = self._held[:cut]
        if drop_rest:
            self._held, self._special_spans = "", []
        else:
            self._held = self._held[cut:]
            self._special_spans = [(s - cut, e - cut) for s, e in self._special_spans if e > cut]
        if piece:
            self._pieces.append(piece)
        return piece
