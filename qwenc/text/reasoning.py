"""Qwen3's thinking: the `<think>...</think>` part of a reply, split from the answer.

A thinking reply reads `<think>\\n{reasoning}\\n</think>\\n\\n{answer}`. The split gives the
reasoning and the answer as Qwen3's own chat template recovers them when it renders the reply
back into a prompt: newlines around the reasoning and before the answer are not part of either.

Where the reply starts (`phase`, see constraints.thinking_phase): "maybe" (the reply may open
with `<think>`), "thinking" (the prompt already opened it, as thinking-only templates do), or
"answer" / None (no thinking to split).

`split_reasoning` works on a whole reply; `ReasoningStream` on a reply arriving in pieces, and
what it releases adds up to the same split whatever the pieces: text that may still turn out to
be part of a `<think>` / `</think>` tag, or newlines that may still turn out to be the ones
around the reasoning, is held until that is clear.
"""
from __future__ import annotations

THINK_START, THINK_END = "<think>", "</think>"
PHASES = ("maybe", "thinking", "answer", None)


def _check_phase(phase):
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")


def split_reasoning(text: str, phase="maybe"):
    """(reasoning or None, answer) of a whole reply. reasoning is None when the reply has no
    thinking part; a thinking part that never closed (the reply was cut short) is all reasoning."""
    _check_phase(phase)
    if phase in ("answer", None):
        return None, text
    if phase == "maybe":
        if not text.startswith(THINK_START):
            return None, text
        text = text[len(THINK_START):]
    end = text.find(THINK_END)
    if end < 0:
        return text.strip("\n"), ""
    return text[:end].strip("\n"), text[end + len(THINK_END):].lstrip("\n")


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for k in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0


class ReasoningStream:
    """push(text) -> deltas, finish() -> deltas; each delta {"reasoning_content": str} or
    {"content": str}. Their concatenations equal split_reasoning of the whole text."""

    def __init__(self, phase="maybe"):
        _check_phase(phase)
        self.state = {"maybe": "start", "thinking": "lead", "answer": "content", None: "content"}[phase]
        self._buf = ""
        self.reasoning = None  # the reasoning so far ("" once a thinking part opened)
        self.content = ""
        if self.state == "lead":
            self.reasoning = ""

    def push(self, text: str):
        self._buf += text
        out = []
        self._run(out, final=False)
        return _merge(out)

    def finish(self):
        out = []
        self._run(out, final=True)
        return _merge(out)

    def _emit(self, out, key, text):
        if text:
            out.append({key: text})
            if key == "content":
                self.content += text
            else:
                self.reasoning += text

    def _run(self, out, final):
        while True:
            buf = self._buf
            if self.state == "start":
                if buf.startswith(THINK_START):
                    self._buf, self.state, self.reasoning = buf[len(THINK_START):], "lead", ""
                    continue
                if THINK_START.startswith(buf) and not final:
                    return  # still possibly "<think>"
                self.state = "content"
                continue
            if self.state == "lead":  # newlines opening the reasoning are not part of it
                stripped = buf.lstrip("\n")
                self._buf = stripped
                if not stripped:
                    return
                self.state = "reasoning"
                continue
            if self.state == "reasoning":
                end = buf.find(THINK_END)
                if end >= 0:
                    self._emit(out, "reasoning_content", buf[:end].rstrip("\n"))
                    self._buf, self.state = buf[end + len(THINK_END):], "answer_lead"
                    continue
                if final:
                    held = buf.rstrip("\n")  # a cut-off reasoning loses its trailing newlines too
                    self._emit(out, "reasoning_content", held)
                    self._buf = ""
                    return
                hold = _partial_suffix(buf, THINK_END)
                body = buf[:len(buf) - hold]
                keep = len(body) - len(body.rstrip("\n"))  # newlines that may precede </think>
                cut = len(body) - keep
                self._emit(out, "reasoning_content", buf[:cut])
                self._buf = buf[cut:]
                return
            if self.state == "answer_lead":
                stripped = buf.lstrip("\n")
                self._buf = stripped
                if not stripped:
                    return
                self.state = "content"
                continue
            # content: everything as it comes
            self._emit(out, "content", buf)
            self._buf = ""
            return


def _merge(deltas):
    """Adjacent deltas of the same kind joined into one."""
    merged = []
    for d in deltas:
        if merged and merged[-1].keys() == d.keys() and len(d) == 1:
            key = next(iter(d))
            if isinstance(d[key], str):
                merged[-1] = {key: merged[-1][key] + d[key]}
                continue
        merged.append(d)
    return merged
