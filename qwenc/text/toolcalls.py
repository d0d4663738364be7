"""Tool calls as Qwen2.5 / Qwen3 write them, read into OpenAI's `tool_calls`, and forced by a grammar.

The model calls a function by writing, after any text of its own,

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

possibly several times (one block per call, a newline between blocks). A block is a call when its
body is one JSON object with a string `name` (one of the tools, when they are known) and an object
`arguments` (missing means {}); anything else (bad JSON, other keys' types, a block that never
closes its object) stays in the reply as text, markup and all: a malformed call is returned as
text, never an exception. The end of a block's object is found by scanning the JSON (strings and
nesting), so `</tool_call>` written inside an argument does not end the block.

Whitespace between a call and the start or the end of the reply (the newline before a first block,
after a last one) belongs to neither the content nor the call; between two pieces of text it stays.
`arguments` is the JSON text of the arguments object, re-serialized (json.dumps, ensure_ascii=False).

`ToolCallStream` reads a reply arriving in pieces and returns OpenAI-style deltas: `{"content": s}`
and, for each call once its block is complete, `{"tool_calls": [{"index", "id", "type", "function":
{"name", "arguments": ""}}]}` then `{"tool_calls": [{"index", "function": {"arguments": s}}]}`. No
text that may still be (part of) a call's markup is released as content, so `<tool_call>` never
leaks; whatever the pieces, the deltas add up to what `parse_tool_calls` gives for the whole reply.
A call is released only when its block has closed, since until then it may still turn out to be
malformed, i.e. text.

Bare calls: Qwen2.5-Coder (the demo model among them) often answers a request with tools by writing
the call object without the tags, alone or in a ```json fence, one object per call or a list of
them. When the functions are known (a request with tools), a reply that is nothing but such calls,
every one a name of a declared function and its arguments ("arguments" or "parameters") and no
other key, is read as those calls; any other text, an unknown name or a
malformed object and the reply is content, as written. So that such a reply never streams out as
text first, a reply starting with `{`, `[` or a fence is held until it is decided: released as
soon as it can no longer be a bare call, else at its end.

`ReplyParser` chains the thinking split (qwenc.text.reasoning) and the tool-call reader: the
assistant message of an OpenAI chat completion, whole or as deltas.

For tool_choice "required" or a named function, qwenc.engine.constraints.tool_call_constraint
builds the grammar that forces well-formed blocks whose arguments validate against the function's
parameter schema; `tool_choice_mode` reads tool_choice for it.
"""
from __future__ import annotations

import json
import uuid

from ..errors import InvalidRequest
from .reasoning import ReasoningStream

CALL_START, CALL_END = "<tool_call>", "</tool_call>"
_WS = " \t\r\n"


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _partial_suffix(text: str, tag: str) -> int:
    for k in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0


def _as_call(body: str, known_names):
    """(name, arguments JSON text) when body is a well-formed call, else None."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    return _call_of(obj, known_names)


def _call_of(obj, known_names):
    """_as_call of a parsed JSON value."""
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name or (known_names is not None and name not in known_names):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return name, json.dumps(args, ensure_ascii=False)


class _JsonScan:
    """Where a JSON value ends, read one character at a time: nesting, and strings (escapes
    included), whose brackets do not count."""

    def __init__(self):
        self.depth = 0
        self.in_string = self.escape = False

    def step(self, c: str) -> bool:
        """True when c closes the value."""
        if self.in_string:
            if self.escape:
                self.escape = False
            elif c == "\\":
                self.escape = True
            elif c == '"':
                self.in_string = False
            return False
        if c == '"':
            self.in_string = True
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1
            return self.depth == 0
        return False


class _Block:
    """Scans one block's body (the text after <tool_call>) as it arrives."""

    def __init__(self):
        self.text = ""
        self.pos = 0
        self.phase = "lead"      # lead -> object -> tail -> done | bad
        self.scan = _JsonScan()
        self.obj_start = self.obj_end = None
        self.end = None          # index in text where CALL_END starts (done) / is searched (bad)
        self.search_from = 0

    def feed(self, text: str):
        self.text += text
        t = self.text
        while self.pos < len(t) and self.phase in ("lead", "object", "tail"):
            c = t[self.pos]
            if self.phase == "lead":
                if c in _WS:
                    self.pos += 1
                    continue
                if c != "{":
                    return self._bad(self.pos)
                self.phase, self.obj_start = "object", self.pos
            if self.phase == "object":
                self.pos += 1
                if self.scan.step(c):
                    self.phase, self.obj_end = "tail", self.pos
                elif c == "<" and not self.scan.in_string:  # never JSON outside a string: broken
                    return self._bad(self.pos - 1)
                continue
            # tail: whitespace, then </tool_call>
            if c in _WS:
                self.pos += 1
                continue
            rest = t[self.pos:]
            if rest.startswith(CALL_END):
                self.phase, self.end = "done", self.pos
                return
            if CALL_END.startswith(rest):
                return  # wait for more
            return self._bad(self.pos)
        if self.phase == "bad":
            self._search()

    def _bad(self, at):
        self.phase, self.search_from = "bad", at
        self._search()

    def _search(self):
        i = self.text.find(CALL_END, self.search_from)
        if i >= 0:
            self.phase, self.end = "badend", i
        else:
            self.search_from = max(self.search_from, len(self.text) - len(CALL_END) + 1)

    @property
    def closed(self):
        return self.phase in ("done", "badend")

    def rest(self):
        """Text after the block's closing tag."""
        return self.text[self.end + len(CALL_END):]


_FENCE = "```"
_BARE_KEYS = {"name", "arguments", "parameters"}


def _calls_of_value(value_text, known_names):
    """The calls of one bare JSON value (an object, or a non-empty list of objects), or None.
    Without the tags, an object is a call only when it holds a name and its arguments and
    nothing else: {"name": "get_weather", "description": ...} describes a function, it does not
    call it."""
    try:
        value = json.loads(value_text)
    except ValueError:
        return None
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        whole = isinstance(item, dict) and set(item) <= _BARE_KEYS and len(item) == 2
        call = _call_of(item, known_names) if whole else None
        if call is None:
            return None
        calls.append(call)
    return calls or None


class _BareReply:
    """Reads a whole reply as bare calls (see the module's doc), one character at a time:
    verdict turns False as soon as the text can no longer be one; accepted() says, at the end,
    whether it is one."""

    def __init__(self, known_names):
        self.known_names = known_names
        self.text = ""
        self.pos = 0
        self.phase = "lead"      # lead -> (info ->) between <-> value -> (after)
        self.fenced = False
        self.scan = None
        self.value_start = 0
        self.calls = []
        self.verdict = None      # None: may still be bare calls; False: is not

    def feed(self, text):
        self.text += text
        t = self.text
        while self.verdict is None and self.pos < len(t):
            c = t[self.pos]
            if self.phase == "value":
                self._value_char(c)
                continue
            if self.phase == "info":  # the fence's language word, up to its newline
                if c == "\n":
                    self.phase = "between"
                elif not (c.isalnum() or c in " \t\r"):
                    self.verdict = False
                self.pos += 1
                continue
            if c in _WS:
                self.pos += 1
                continue
            if self.phase == "after" or (c == "`" and self.phase == "between" and not self.fenced):
                self.verdict = False
            elif c == "`" and self.phase in ("lead", "between"):
                rest = t[self.pos:self.pos + len(_FENCE)]
                if len(rest) < len(_FENCE):
                    if not _FENCE.startswith(rest):
                        self.verdict = False
                    return  # wait for the rest of the fence
                if rest != _FENCE:
                    self.verdict = False
                    return
                self.pos += len(_FENCE)
                if self.phase == "lead":
                    self.phase, self.fenced = "info", True
                else:
                    self.phase = "after"
            elif c in "{[":
                self.phase, self.scan, self.value_start = "value", _JsonScan(), self.pos
            else:
                self.verdict = False

    def _value_char(self, c):
        self.pos += 1
        if self.scan.step(c):
            calls = _calls_of_value(self.text[self.value_start:self.pos], self.known_names)
            if calls is None:
                self.verdict = False
            else:
                self.calls += calls
                self.phase = "between"

    def accepted(self):
        """At the reply's end: it was bare calls and nothing else (a fence left open is allowed:
        the calls in it are whole)."""
        return self.verdict is None and self.phase in ("between", "after") and bool(self.calls)


class ToolCallStream:
    """Feed reply text with push(); call finish() at the end. Both return lists of deltas."""

    def __init__(self, known_names=None, id_factory=new_call_id):
        self.known_names = None if known_names is None else set(known_names)
        self.id_factory = id_factory
        self.calls = []          # {"id", "type", "function": {"name", "arguments"}}
        self.content_parts = []
        self._buf = ""           # outside text not yet released
        self._ws = ""            # whitespace held at the end of the content
        self._ws_by_call = False  # a call came during that whitespace: it is dropped at the end
        self._block = None
        self._finished = False
        # a reply with declared functions may be bare calls: held until that is decided
        self._bare = _BareReply(self.known_names) if self.known_names else None

    @property
    def content(self):
        """The content so far: None when there are calls and no other text."""
        text = "".join(self.content_parts)
        return None if (self.calls and not text) else text

    def push(self, text: str):
        if self._finished:
            raise RuntimeError("push() after finish()")
        out = []
        self._run(text, out, final=False)
        return _merge(out)

    def finish(self):
        if self._finished:
            return []
        out = []
        self._run("", out, final=True)
        self._finished = True
        return out and _merge(out)

    # -- internals ---------------------------------------------------------------------------

    def _content(self, out, text):
        """Release outside text, holding trailing whitespace: it may turn out to be next to a call."""
        body = text.strip(_WS)
        if not body:
            self._ws += text
            return
        lead = text[:len(text) - len(text.lstrip(_WS))]
        self._release_ws(out, self._ws + lead)
        self._release(out, body)
        self._ws = text[len(lead) + len(body):]

    def _release_ws(self, out, ws):
        """Whitespace between two pieces of content is kept; before the first one, when a call
        came first, it is the call's."""
        if not (self._ws_by_call and not self.content_parts):
            self._release(out, ws)
        self._ws_by_call = False

    def _release(self, out, text):
        if text:
            self.content_parts.append(text)
            out.append({"content": text})

    def _run(self, text, out, final):
        if self._bare is not None:
            self._bare.feed(text)
            if self._bare.verdict is None and not final:
                return
            bare, self._bare = self._bare, None
            if final and bare.accepted():
                for name, arguments in bare.calls:
                    self._add_call(out, name, arguments)
                return
            text = bare.text  # not bare calls: read as any reply
        pending = text
        while True:
            if self._block is not None:
                self._block.feed(pending)
                pending = ""
                if not self._block.closed and not final:
                    return
                block, self._block = self._block, None
                pending = block.rest() if block.closed else ""
                self._close_block(block, out)
                continue
            buf = self._buf + pending
            pending = ""
            start = buf.find(CALL_START)
            if start >= 0:
                self._content(out, buf[:start])
                self._buf = ""
                self._block = _Block()
                pending = buf[start + len(CALL_START):]
                continue
            hold = 0 if final else _partial_suffix(buf, CALL_START)
            self._content(out, buf[:len(buf) - hold])
            self._buf = buf[len(buf) - hold:]
            if final:
                if not self._ws_by_call:
                    self._release(out, self._ws)
                self._ws = ""
            return

    def _close_block(self, block, out):
        call = None
        if block.phase == "done" or (block.phase == "tail" and not block.text[block.pos:].strip(_WS)):
            call = _as_call(block.text[block.obj_start:block.obj_end], self.known_names)
        if call is None:  # text, markup and all
            raw = CALL_START + (block.text[:block.end + len(CALL_END)] if block.closed else block.text)
            self._release_ws(out, self._ws)
            self._release(out, raw)
            self._ws = ""
            return
        self._add_call(out, *call)

    def _add_call(self, out, name, arguments):
        self._ws_by_call = True
        index, call_id = len(self.calls), self.id_factory()
        self.calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
        out.append({"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                    "function": {"name": name, "arguments": ""}}]})
        out.append({"tool_calls": [{"index": index, "function": {"arguments": arguments}}]})


def _merge(deltas):
    merged = []
    for d in deltas:
        if merged and "content" in d and "content" in merged[-1] and len(d) == len(merged[-1]) == 1:
            merged[-1] = {"content": merged[-1]["content"] + d["content"]}
        else:
            merged.append(d)
    return merged


def parse_tool_calls(text: str, known_names=None, id_factory=new_call_id):
    """(content, calls) of a whole reply: content is the text outside the calls (None when
    there are calls and nothing else), calls OpenAI's tool_calls list. Never raises on the text."""
    stream = ToolCallStream(known_names, id_factory)
    stream.push(text)
    stream.finish()
    return stream.content, stream.calls


# ---------------------------------------------------------------- the whole reply

class ReplyParser:
    """An assistant reply, streamed or whole, as OpenAI's message fields.

    phase: where the reply starts with respect to thinking (reasoning.split_reasoning);
    tools: whether tool calls are read (else the answer is all content); known_names: the
    functions that may be called (others stay text).
    """

    def __init__(self, phase=None, tools=False, known_names=None, id_factory=new_call_id):
        self.reasoning = ReasoningStream(phase)
        self.tools = ToolCallStream(known_names, id_factory) if tools else None
        self._content = []

    def push(self, text: str):
        return self._chain(self.reasoning.push(text), final=False)

    def finish(self):
        return self._chain(self.reasoning.finish(), final=True)

    def _chain(self, deltas, final):
        out = []
        for d in deltas:
            if "content" in d and self.tools is not None:
                out += self.tools.push(d["content"])
            else:
                out.append(d)
        if final and self.tools is not None:
            out += self.tools.finish()
        return out

    @property
    def tool_calls(self):
        return self.tools.calls if self.tools is not None else []

    def message(self) -> dict:
        """The assistant message (call after finish)."""
        content = self.tools.content if self.tools is not None else self.reasoning.content
        msg = {"role": "assistant", "content": content}
        if self.reasoning.reasoning is not None:
            msg["reasoning_content"] = self.reasoning.reasoning
        if self.tool_calls:
            msg["tool_calls"] = list(self.tool_calls)
        return msg


def parse_reply(text: str, phase=None, tools=False, known_names=None, id_factory=new_call_id) -> dict:
    """The assistant message of a whole reply (see ReplyParser)."""
    parser = ReplyParser(phase, tools, known_names, id_factory)
    parser.push(text)
    parser.finish()
    return parser.message()


# ---------------------------------------------------------------- requests: tools and history

def functions_of(tools):
    """name -> function dict of OpenAI `tools`, checked."""
    out = {}
    for tool in tools or ():
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise InvalidRequest(f"each tool must be {{'type': 'function', 'function': {{'name', 'parameters'}}}}, got {tool!r}"[:300])
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"a tool's function needs a name, got {fn!r}"[:300])
        out[name] = fn
    return out


def tool_names(tools):
    return list(functions_of(tools))


def tool_choice_mode(tool_choice, tools):
    """("none" | "auto" | "required", function name or None) of an OpenAI tool_choice."""
    names = functions_of(tools)
    if tool_choice is None:
        return ("auto" if names else "none"), None
    if tool_choice in ("none", "auto", "required"):
        if tool_choice == "required" and not names:
            raise InvalidRequest("tool_choice 'required' needs tools")
        return tool_choice, None
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if name is None:
            raise InvalidRequest("a named tool_choice is {'type': 'function', 'function': {'name': ...}}")
        if name not in names:
            raise InvalidRequest(f"tool_choice names function {name!r}, which is not among the tools "
                                 f"{sorted(names)}")
        return "required", name
    raise InvalidRequest(f"tool_choice must be 'none', 'auto', 'required' or a named function, got {tool_choice!r}")


def prepare_messages(messages):
    """OpenAI-format chat messages made ready for a chat template: an assistant message's
    `tool_calls[].function.arguments` arrive as a JSON string, while Qwen's templates expect the
    arguments object (Qwen2.5's writes `arguments | tojson`, which would quote the string again).
    Arguments that do not parse as a JSON object are left as they are."""
    out = []
    for message in messages:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if not calls:
            out.append(message)
            continue
        fixed = []
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            args = fn.get("arguments") if isinstance(fn, dict) else None
            if isinstance(args, str):
                try:
                    parsed = json.loads(args)
                except ValueError:
                    parsed = None
                if isinstance(parsed, dict):
                    call = {**call, "function": {**fn, "arguments": parsed}}
            fixed.append(call)
        out.append({**message, "tool_calls": fixed})
    return out
