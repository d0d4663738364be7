"""Constrained decoding: JSON schemas, regular expressions and context-free grammars turned into
per-token masks over the model's vocabulary.

The grammar engine is llguidance (a Rust library with a Python face and no Python dependencies).
It was chosen over xgrammar, which imports torch and transformers at import time, and over
outlines-core, which has no context-free grammars and builds a regex automaton over the whole
vocabulary up front (about 30 s for "any JSON object" on Qwen's vocabulary); llguidance compiles
lazily (a schema in about a millisecond), computes a mask in tens of microseconds, bounds the work
of every step by "fuel" limits (so no schema can hang a step), takes Lark grammars and converts
GBNF ones, and fills the masks of a whole batch in parallel with the GIL released.

Three objects:
- `TokenizerInfo`: the vocabulary as the engine sees it (each token's bytes; added tokens such as
  `<|im_end|>` or `<tool_call>` marked special, so that text constraints never produce them by
  accident; padded logits rows beyond the tokenizer never allowed) plus the model's EOS ids and a
  cache of compiled grammars. One per model: `tokenizer_info(model)`.
- `Grammar`: a compiled constraint, immutable and shared between requests.
- `Matcher`: one request's position in its grammar. `fill_mask` before sampling, `accept` after.

EOS is allowed exactly when the grammar accepts what was generated so far, and once the grammar
can take nothing more (`is_terminated`) the EOS tokens are the only ones allowed.

Masks are bitmasks of int32 words, bit `t % 32` of word `t // 32` standing for token t (the
layout llguidance writes); `apply_mask` turns them into -inf logits.
"""
from __future__ import annotations

import json
import os
import threading
import weakref
from collections import OrderedDict

import numpy as np

from ..errors import ConstraintViolation, InvalidRequest
from ..text.toolcalls import functions_of, tool_choice_mode

try:  # the server's JSON mode needs it, so it is a core dependency; failing here names it
    import llguidance as _llg
except ImportError as _exc:  # pragma: no cover - exercised only on a broken install
    _llg = None
    _IMPORT_ERROR = _exc

# Whitespace the JSON grammars allow between tokens: any JSON whitespace, but at most this much
# in one place. Unbounded whitespace lets a small model loop on newlines until max_tokens; 24
# characters still fit pretty-printed JSON six levels deep at four spaces.
JSON_WHITESPACE = r"[\x20\x0A\x0D\x09]{0,24}"

# Limits for compiling and for each step: llguidance's defaults, with its error messages kept
# short (no parser state dump in an error a client sees).
_CACHE_SIZE = 128
_VALUE_KEYS = ("enum", "const", "default", "examples")  # JSON values inside a schema, not schemas


def _require_engine():
    if _llg is None:
        raise ImportError(f"constrained decoding needs the llguidance package ({_IMPORT_ERROR}); "
                          "pip install llguidance")


def _limits():
    return _llg.LLParserLimits(verbose_errors=False)


def _short(message: str, limit: int = 400) -> str:
    message = " ".join(str(message).split())
    return message if len(message) <= limit else message[:limit] + "..."


class TokenizerInfo:
    """The model's vocabulary for the grammar engine, and the grammars compiled against it.

    `tokenizer` is qwenc's Tokenizer (token_bytes, added_tokens, encode); `n_rows` the width of
    the logits rows (the model's possibly padded vocabulary); `eos_token_ids` the tokens that end
    a generation.
    """

    def __init__(self, tokenizer, n_rows: int, eos_token_ids):
        _require_engine()
        self.tokenizer = tokenizer
        self.n_rows = int(n_rows)
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids if 0 <= int(t) < self.n_rows)
        if not self.eos_token_ids:
            raise InvalidRequest("constrained decoding needs at least one EOS token id inside the vocabulary")
        self.n_words = (self.n_rows + 31) // 32
        added = set(tokenizer.added_tokens.values())
        tokens = []
        self.real = np.zeros(self.n_rows, dtype=bool)  # rows that are tokens at all
        for i in range(self.n_rows):
            try:
                data = tokenizer.token_bytes(i)
            except (IndexError, ValueError):  # padding rows and ids that are no token
                data = b""
            if data and i in added:
                data = b"\xff" + data  # llguidance's mark of a special token: never matched as text
            self.real[i] = bool(data)
            tokens.append(data)
        self._token_bytes = tokens
        wrapper = _Wrapper(tokens, self.eos_token_ids[0], sorted(added), tokenizer)
        self.ll = _llg.LLTokenizer(_llg.TokenizerWrapper(wrapper), n_vocab=self.n_rows,
                                   eos_token=list(self.eos_token_ids))
        # Every real token allowed: the mask of an unconstrained row. While a reply is still
        # thinking, everything but EOS (a reply must not end before its constrained answer).
        self.full_row = pack_bits(self.real)
        thinking = self.real.copy()
        thinking[list(self.eos_token_ids)] = False
        self.thinking_row = pack_bits(thinking)
        self._cache = OrderedDict()
        self._lock = threading.Lock()

    def token_id(self, text: str):
        """Id of an added token (e.g. "<tool_call>"), or None."""
        return self.tokenizer.added_tokens.get(text)

    def token_ids_made_of(self, allowed: bytes, limit: int = 8):
        """Ids of ordinary tokens whose bytes consist only of `allowed` bytes (e.g. newlines)."""
        out = []
        for i, data in enumerate(self._token_bytes):
            if data and data[0] != 0xFF and all(b in allowed for b in data):
                out.append(i)
                if len(out) == limit:
                    break
        return out

    def compile(self, spec) -> "Grammar":
        """compile_constraint(self, spec), cached by the spec's canonical text."""
        return compile_constraint(self, spec)


class _Wrapper:
    """What llguidance.TokenizerWrapper reads: token bytes, EOS, specials, and an encoder."""

    def __init__(self, tokens, eos, specials, tokenizer):
        self.tokens = tokens
        self.eos_token_id = eos
        self.bos_token_id = None
        self.special_token_ids = specials
        self._tok = tokenizer

    def __call__(self, text):
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tok.encode(text, allow_special=False)


_INFOS = weakref.WeakKeyDictionary()
_INFOS_LOCK = threading.Lock()


def tokenizer_info(model) -> TokenizerInfo:
    """The TokenizerInfo of a Model, built on first use (about a second) and kept with it."""
    with _INFOS_LOCK:
        info = _INFOS.get(model)
        if info is None:
            if model.tokenizer is None:
                raise InvalidRequest(f"{model.source or 'this model'} has no tokenizer: constrained decoding "
                                     "needs one")
            info = TokenizerInfo(model.tokenizer, model.config.vocab_size, model.eos_token_ids)
            _INFOS[model] = info
        return info


# ---------------------------------------------------------------- specs

def _is_pydantic_class(obj) -> bool:
    return isinstance(obj, type) and callable(getattr(obj, "model_json_schema", None))


def pydantic_schema(cls) -> dict:
    """A pydantic model's JSON schema, its objects closed (additionalProperties: false) where the
    model does not say otherwise: extra keys would be dropped by the model's validation anyway,
    and left open a model keeps inventing them (OpenAI's client closes them the same way)."""
    def close(node):
        if isinstance(node, dict):
            node = {k: (v if k in _VALUE_KEYS else close(v)) for k, v in node.items()}
            if node.get("type") == "object" and "properties" in node and "additionalProperties" not in node:
                node["additionalProperties"] = False
        elif isinstance(node, list):
            node = [close(v) for v in node]
        return node
    return close(cls.model_json_schema())


def _schema_of(obj, where: str) -> dict:
    if _is_pydantic_class(obj):
        return pydantic_schema(obj)
    if isinstance(obj, str):
        try:
            obj = json.loads(obj)
        except ValueError as exc:
            raise InvalidRequest(f"{where}: not valid JSON: {exc}") from None
    if isinstance(obj, bool):
        obj = {} if obj else {"not": {}}
    if not isinstance(obj, dict):
        raise InvalidRequest(f"{where}: a JSON schema must be an object (dict) or a pydantic model class, "
                             f"got {type(obj).__name__}")
    return obj


def normalize_spec(spec):
    """(kind, text, strict, label) of a constraint spec, or None for "no constraint".

    A schema's text keeps its key order: the grammar writes an object's properties in the
    order the schema lists them.

    kind is "json", "regex" or "grammar"; text the schema (canonical JSON), the regex or the
    grammar; label names it in error messages.
    """
    if spec is None:
        return None
    if _is_pydantic_class(spec):
        return "json", json.dumps(pydantic_schema(spec)), True, f"schema of {spec.__name__}"
    if not isinstance(spec, dict):
        raise InvalidRequest("a constraint is a dict ({'type': 'json_object' | 'json_schema' | 'regex' | "
                             f"'grammar', ...}}), a JSON schema or a pydantic model class; got {type(spec).__name__}")
    kind = spec.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return "json", json.dumps({"type": "object"}), True, "json_object"
    if kind == "json_schema":
        body = spec.get("json_schema")
        if _is_pydantic_class(body):
            body = {"name": body.__name__, "schema": body}
        if not isinstance(body, dict) or "schema" not in body:
            raise InvalidRequest("response_format json_schema needs 'json_schema': {'name': ..., 'schema': {...}}")
        name = body.get("name") or "schema"
        strict = body.get("strict")
        schema = _schema_of(body["schema"], f"json_schema {name!r}")
        return "json", json.dumps(schema), strict is not False, f"json_schema {name!r}"
    if kind == "regex":
        regex = spec.get("regex")
        if not isinstance(regex, str):
            raise InvalidRequest("a regex constraint needs 'regex': a string")
        return "regex", regex, True, "regex"
    if kind == "grammar":
        grammar = spec.get("grammar")
        if not isinstance(grammar, str) or not grammar.strip():
            raise InvalidRequest("a grammar constraint needs 'grammar': a Lark or GBNF grammar string")
        return "grammar", grammar, True, "grammar"
    if kind in ("lark", "llguidance"):  # engine-native forms, used by the tool-call grammars
        text = spec.get(kind)
        if not isinstance(text, str):
            raise InvalidRequest(f"a {kind} constraint needs {kind!r}: a string")
        return kind, text, True, kind
    # Anything else is a JSON schema itself ({"type": "object", ...}, {"$ref": ...}, {"enum": ...}).
    return "json", json.dumps(spec), True, "json schema"


# Date and time formats as patterns, tighter than the engine's own: its date allows 2021-02-31,
# its date-time a leap second (:60) and a lowercase "t"/"z", all of which Python's
# datetime, pydantic and jsonschema's format checker refuse. Years 0001-9999, real calendar
# days (Feb 29 in leap years only), seconds 00-59, at most microseconds, an explicit offset.
_YEAR = r"(\d{3}[1-9]|\d{2}[1-9]\d|\d[1-9]\d{2}|[1-9]\d{3})"
_LEAP = r"(\d\d(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
_DATE = (rf"({_YEAR}-(0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|{_YEAR}-(0[469]|11)-(0[1-9]|[12]\d|30)"
         rf"|{_YEAR}-02-(0[1-9]|1\d|2[0-8])|{_LEAP}-02-29)")
_TIME = r"([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)"
_FORMAT_PATTERNS = {"date": f"^{_DATE}$", "time": f"^{_TIME}$", "date-time": f"^{_DATE}T{_TIME}$"}


def _tighten_formats(node):
    """The schema with date/time formats replaced by the patterns above (a copy)."""
    if isinstance(node, list):
        return [_tighten_formats(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: (v if k in _VALUE_KEYS else _tighten_formats(v)) for k, v in node.items()}
    fmt = out.get("format")
    if isinstance(fmt, str) and fmt in _FORMAT_PATTERNS and "pattern" not in out:
        del out["format"]
        out["pattern"] = _FORMAT_PATTERNS[fmt]
    return out


def _engine_grammar(kind: str, text: str, strict: bool, label: str) -> str:
    try:
        if kind == "json":
            options = {"whitespace_pattern": JSON_WHITESPACE}
            if not strict:
                options["lenient"] = True  # unsupported keywords are ignored, not errors
            return _llg.LLMatcher.grammar_from_json_schema(json.dumps(_tighten_formats(json.loads(text))),
                                                           overrides=options)
        if kind == "regex":
            return _llg.LLMatcher.grammar_from_regex(text)
        if kind == "grammar":
            return _llg.grammar_from("grammar", text)  # Lark, or GBNF converted to Lark
        if kind == "lark":
            return _llg.LLMatcher.grammar_from_lark(text)
        return text
    except (ValueError, TypeError, RuntimeError) as exc:
        raise InvalidRequest(f"{label}: cannot compile: {_short(exc)}") from None


class Grammar:
    """A compiled constraint: immutable, shared by every request that uses the same spec."""

    def __init__(self, info: TokenizerInfo, engine_grammar: str, label: str):
        self.info = info
        self.label = label
        self._pristine = _llg.LLMatcher(info.ll, engine_grammar, log_level=0, limits=_limits())
        if self._pristine.is_error():
            raise InvalidRequest(f"{label}: cannot compile: {_short(self._pristine.get_error())}")
        self._lock = threading.Lock()

    def matcher(self) -> "Matcher":
        with self._lock:  # deep_copy shares the compiled lexer; copy one at a time
            return Matcher(self, self._pristine.deep_copy())

    def __repr__(self):
        return f"<Grammar {self.label}>"


def compile_constraint(info: TokenizerInfo, spec):
    """The Grammar of `spec`, or None when spec asks for no constraint ({"type": "text"} / None).

    spec: {"type": "json_object"}, {"type": "json_schema", "json_schema": {"name", "schema",
    "strict"}}, {"type": "regex", "regex": ...}, {"type": "grammar", "grammar": <Lark or GBNF>},
    a pydantic model class, or a JSON-schema dict. A JSON schema is strict unless its spec says
    "strict": false: a keyword the engine does not implement (e.g. uniqueItems) is then an error
    rather than silently unenforced. Raises InvalidRequest naming what cannot be compiled.
    """
    normalized = normalize_spec(spec)
    if normalized is None:
        return None
    kind, text, strict, label = normalized
    key = (kind, text, strict)
    with info._lock:
        grammar = info._cache.get(key)
        if grammar is not None:
            info._cache.move_to_end(key)
            return grammar
    engine_grammar = _engine_grammar(kind, text, strict, label)
    is_error, messages = _llg.LLMatcher.validate_grammar_with_warnings(engine_grammar, info.ll, limits=_limits())
    if is_error:
        raise InvalidRequest(f"{label}: cannot compile: {_short(messages[0] if messages else 'invalid')}")
    grammar = Grammar(info, engine_grammar, label)
    with info._lock:
        grammar = info._cache.setdefault(key, grammar)
        info._cache.move_to_end(key)
        while len(info._cache) > _CACHE_SIZE:
            info._cache.popitem(last=False)
    return grammar


# ---------------------------------------------------------------- matchers

class Matcher:
    """One request's state in a Grammar. Per token: fill_mask (or apply), sample, accept."""

    def __init__(self, grammar: Grammar, ll):
        self.grammar = grammar
        self.info = grammar.info
        self._ll = ll

    def fill_mask(self, row: np.ndarray) -> None:
        """Write the allowed-token bitmask into `row` (int32, info.n_words words, contiguous)."""
        _check_row(row, self.info)
        self._ll.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        self._check_state()

    def allowed_tokens(self) -> np.ndarray:
        """Ids of the tokens allowed next (for tests and debugging; the engine uses masks)."""
        row = np.zeros(self.info.n_words, dtype=np.int32)
        self.fill_mask(row)
        return np.flatnonzero(unpack_bits(row, self.info.n_rows))

    def apply(self, logits: np.ndarray, row: np.ndarray = None) -> None:
        """Set the logits of disallowed tokens to -inf (a one-row fill_mask + apply_mask)."""
        if row is None:
            row = np.zeros(self.info.n_words, dtype=np.int32)
        self.fill_mask(row)
        apply_mask(logits, row)

    def accept(self, token_id: int) -> None:
        """Advance past a generated token; ConstraintViolation if the grammar does not allow it."""
        token_id = int(token_id)
        if not self._ll.consume_token(token_id):
            raise ConstraintViolation(f"{self.grammar.label}: token {token_id} "
                                      f"({self._token_text(token_id)!r}) is not allowed here: "
                                      f"{_short(self._ll.get_error(), 200)}")

    def can_end(self) -> bool:
        """True when what was generated is complete for the grammar: EOS is allowed now."""
        return bool(self._ll.is_accepting())

    def is_terminated(self) -> bool:
        """True when nothing but EOS can follow (or EOS was accepted): generation is done."""
        return bool(self._ll.is_stopped())

    def _inner(self):
        return self  # what fill_masks computes for this row (a ThinkingGate may answer None)

    def _post_fill(self, row):
        pass

    def _check_state(self):
        if self._ll.is_error():
            raise ConstraintViolation(f"{self.grammar.label}: {_short(self._ll.get_error(), 200)}")

    def _token_text(self, token_id):
        try:
            return self.info.tokenizer.decode([token_id])
        except (IndexError, ValueError):
            return f"<id {token_id}>"


class ThinkingGate:
    """A Matcher that starts after the model's reasoning: Qwen3's `<think>...</think>`.

    Phases: "maybe" (the first token may open `<think>` or start the answer), "thinking" (no
    constraint until `</think>` is generated), "answer" (the grammar applies). Right after
    `</think>` the newlines the model puts before its answer ("\\n\\n") are let through when the
    grammar itself does not take them; they are not part of the constrained text.
    """

    NEWLINE_SKIPS = 2

    def __init__(self, matcher: Matcher, phase: str = "maybe"):
        if phase not in ("maybe", "thinking", "answer"):
            raise ValueError(f"phase must be 'maybe', 'thinking' or 'answer', got {phase!r}")
        info = matcher.info
        self.matcher, self.info, self.phase = matcher, info, phase
        self.grammar = matcher.grammar
        self.think_start = info.token_id("<think>")
        self.think_end = info.token_id("</think>")
        if self.think_end is None:
            self.phase = "answer"
        self._newlines = info.token_ids_made_of(b"\n") if self.think_end is not None else []
        self._skips_left = 0

    def _extra_ids(self):
        if self.phase == "maybe" and self.think_start is not None:
            return [self.think_start]
        if self.phase == "answer" and self._skips_left:
            return self._newlines
        return []

    def _inner(self):
        """The matcher whose mask applies now, or None while thinking."""
        return None if self.phase == "thinking" else self.matcher

    def _post_fill(self, row):
        words = row.view(np.uint32)
        for t in self._extra_ids():
            words[t >> 5] |= np.uint32(1 << (t & 31))

    def fill_mask(self, row):
        if self.phase == "thinking":
            _check_row(row, self.info)
            row[:] = self.info.thinking_row
            return
        self.matcher.fill_mask(row)
        self._post_fill(row)

    def allowed_tokens(self):
        row = np.zeros(self.info.n_words, dtype=np.int32)
        self.fill_mask(row)
        return np.flatnonzero(unpack_bits(row, self.info.n_rows))

    def apply(self, logits, row=None):
        if row is None:
            row = np.zeros(self.info.n_words, dtype=np.int32)
        self.fill_mask(row)
        apply_mask(logits, row)

    def accept(self, token_id):
        token_id = int(token_id)
        if self.phase == "thinking":
            if token_id == self.think_end:
                self.phase, self._skips_left = "answer", self.NEWLINE_SKIPS
            return
        if self.phase == "maybe":
            self.phase = "answer"
            if token_id == self.think_start:
                self.phase = "thinking"
                return
        if self._skips_left and token_id in self._newlines:
            self._skips_left -= 1
            if self.matcher._ll.validate_tokens([token_id]) == 0:
                return  # a newline the grammar does not take: let it through unconstrained
        self._skips_left = 0
        self.matcher.accept(token_id)

    def can_end(self):
        return self.phase == "answer" and self.matcher.can_end()

    def is_terminated(self):
        return self.phase == "answer" and self.matcher.is_terminated()


def thinking_phase(prompt_text: str) -> str:
    """Where a reply starting after `prompt_text` stands with respect to thinking: "thinking"
    when the prompt leaves a `<think>` open (templates of thinking-only models end with it),
    "answer" when the prompt closes one (Qwen3 with enable_thinking=False), else "maybe"."""
    tail = prompt_text.rsplit("<|im_start|>assistant", 1)[-1]
    opened, closed = tail.rfind("<think>"), tail.rfind("</think>")
    if opened > closed:
        return "thinking"
    if closed >= 0:
        return "answer"
    return "maybe"


def constrained_matcher(info: TokenizerInfo, spec, prompt_text: str = None):
    """A fresh matcher for `spec` (None when spec is no constraint). With the prompt of a chat
    whose model thinks (its vocabulary has `</think>`), the grammar starts after the thinking."""
    grammar = compile_constraint(info, spec)
    if grammar is None:
        return None
    matcher = grammar.matcher()
    if prompt_text is not None and info.token_id("</think>") is not None:
        phase = thinking_phase(prompt_text)
        if phase != "answer":
            return ThinkingGate(matcher, phase)
    return matcher


# ---------------------------------------------------------------- tool calls

def _call_schema(fn):
    params = fn.get("parameters")
    if params is None or params == {}:
        params = {"type": "object", "properties": {}, "additionalProperties": False}
    return {"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": params},
            "required": ["name", "arguments"], "additionalProperties": False}


def tool_call_constraint(tools, tool_choice, parallel_tool_calls=True, info: TokenizerInfo = None):
    """A constraint (for constraints.compile_constraint) forcing the reply to be tool calls:
    for tool_choice "required" a call of any of the tools, for a named function a call of it;
    one call, or several when parallel_tool_calls. None for "auto" / "none".

    The blocks are `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, joined by
    newlines; the tags are the tokenizer's own <tool_call> / </tool_call> tokens (spelled as
    text when `info` says the vocabulary has no such tokens). A function
    whose definition says "strict": false gets its schema's unsupported keywords ignored rather
    than refused.
    """
    mode, name = tool_choice_mode(tool_choice, tools)
    if mode in ("none", "auto"):
        return None
    functions = functions_of(tools)
    chosen = [functions[name]] if name else list(functions.values())
    schemas = [_call_schema(fn) for fn in chosen]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    lenient = any(fn.get("strict") is False for fn in chosen)
    options = {"whitespace_pattern": JSON_WHITESPACE}
    if lenient:
        options["lenient"] = True
    schema = {**schema, "x-guidance": options}
    tags = ["<tool_call>", "</tool_call>"]
    if info is not None:
        tags = [tag if info.token_id(tag) is not None else json.dumps(tag) for tag in tags]
    more = ' ("\\n" call)*' if parallel_tool_calls else ""
    # a newline may end the reply too: after a call Qwen2.5-Coder writes one and then wants to end,
    # and with the newline allowed only as the start of another call it was made to call again
    # and again until max_tokens (the demo model: 7 identical calls in 256 tokens)
    lark = (f"start: call{more} \"\\n\"?\n"
            f"call: {tags[0]} \"\\n\" body \"\\n\" {tags[1]}\n"
            f"body: %json {json.dumps(schema)}\n")
    return {"type": "lark", "lark": lark}


# ---------------------------------------------------------------- batches

_EXECUTOR = None
_EXECUTOR_LOCK = threading.Lock()


def _mask_threads(rows: int) -> int:
    """Threads for one fill_masks call. $QWENC_MASK_THREADS sets it; by default rows are filled
    one after another in the calling thread unless the machine has many cores and the batch is
    large: on 2 busy cores, handing 8-16 rows of ~0.05 ms each to a thread pool measured 4-10x
    slower than filling them in turn (bench/bench_constraints.py). Either way the GIL is
    released while a mask is computed."""
    env = os.environ.get("QWENC_MASK_THREADS")
    if env:
        return max(1, int(env))
    cpus = os.cpu_count() or 1
    return min(cpus // 2, 16) if cpus >= 8 and rows >= 8 else 1


def _executor(threads: int):
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None or _EXECUTOR[0] != threads:
            _EXECUTOR = (threads, _llg.LLExecutor(num_threads=threads))
        return _EXECUTOR[1]


def new_bitmask(rows: int, info: TokenizerInfo) -> np.ndarray:
    """A zeroed [rows, n_words] int32 bitmask for fill_masks."""
    return np.zeros((rows, info.n_words), dtype=np.int32)


def fill_masks(matchers, bitmask: np.ndarray) -> None:
    """Fill bitmask row i for matchers[i] (the engine calls this once per step for all its
    constrained rows). The masks are computed with the GIL released, on llguidance's own
    threads in parallel where that pays (see _mask_threads). A None entry gets every real token."""
    if bitmask.ndim != 2 or bitmask.dtype != np.int32 or not bitmask.flags["C_CONTIGUOUS"]:
        raise ValueError("bitmask must be a C-contiguous 2-D int32 array")
    if len(matchers) > bitmask.shape[0]:
        raise ValueError(f"{len(matchers)} matchers but {bitmask.shape[0]} bitmask rows")
    work, post = [], []
    for i, m in enumerate(matchers):
        if m is None:
            info = next((x.info for x in matchers if x is not None), None)
            bitmask[i] = -1 if info is None else info.full_row
            continue
        if m._inner() is None:
            m.fill_mask(bitmask[i])
            continue
        inner = m._inner()
        _check_row(bitmask[i], inner.info)
        work.append((inner._ll, i))
        if m is not inner:
            post.append((m, i))
    threads = _mask_threads(len(work)) if work else 1
    if threads > 1:
        _executor(threads).unsafe_compute_mask_ptr(work, bitmask.ctypes.data, bitmask.shape[1] * 4,
                                                   bitmask.shape[0])
    else:
        row_bytes = bitmask.shape[1] * 4
        for ll, i in work:
            ll.unsafe_compute_mask_ptr(bitmask.ctypes.data + i * row_bytes, row_bytes)
    if work:
        for ll, i in work:
            if ll.is_error():
                raise ConstraintViolation(_short(ll.get_error(), 200))
    for m, i in post:
        m._post_fill(bitmask[i])



def _check_row(row, info):
    if row.dtype != np.int32 or row.ndim != 1 or row.shape[0] != info.n_words or not row.flags["C_CONTIGUOUS"]:
        raise ValueError(f"a mask row is a contiguous int32 array of {info.n_words} words, got "
                         f"{row.dtype} {row.shape}")


# ---------------------------------------------------------------- bits and logits

def pack_bits(allowed: np.ndarray) -> np.ndarray:
    """Bool array over token ids -> int32 bitmask words."""
    n_words = (allowed.shape[-1] + 31) // 32
    padded = np.zeros(allowed.shape[:-1] + (n_words * 32,), dtype=bool)
    padded[..., :allowed.shape[-1]] = allowed
    return np.packbits(padded, axis=-1, bitorder="little").view("<i4").astype(np.int32)


def unpack_bits(bitmask: np.ndarray, n: int) -> np.ndarray:
    """int32 bitmask words -> bool array over the first n token ids."""
    words = np.ascontiguousarray(bitmask, dtype="<i4")
    return np.unpackbits(words.view(np.uint8), axis=-1, bitorder="little")[..., :n].astype(bool)


def apply_mask(logits: np.ndarray, bitmask: np.ndarray) -> None:
    """Set logits of tokens whose bit is clear to -inf, in place. logits [V] or [B, V] float32,
    bitmask [W] or [B, W]; columns beyond 32*W (padded rows) are always disallowed."""
    two_d = logits.ndim == 2
    rows = logits if two_d else logits[None, :]
    masks = bitmask if bitmask.ndim == 2 else bitmask[None, :]
    if rows.shape[0] != masks.shape[0]:
        raise ValueError(f"{rows.shape[0]} logits rows but {masks.shape[0]} mask rows")
    v = rows.shape[1]
    covered = min(v, masks.shape[1] * 32)
    allowed = unpack_bits(masks, covered)
    np.copyto(rows[:, :covered], np.float32(-np.inf), where=~allowed)
    if covered < v:
        rows[:, covered:] = -np.inf


def constraint_spec(regex=None, json_schema=None, grammar=None, response_format=None):
    """One constraint spec from the keyword forms of the Python API (at most one may be given)."""
    given = [k for k, v in (("regex", regex), ("json_schema", json_schema), ("grammar", grammar),
                            ("response_format", response_format)) if v is not None]
    if len(given) > 1:
        raise InvalidRequest(f"give at most one constraint, got {', '.join(given)}")
    if regex is not None:
        return {"type": "regex", "regex": regex}
    if grammar is not None:
        return {"type": "grammar", "grammar": grammar}
    if json_schema is not None:
        if isinstance(json_schema, dict) and json_schema.get("type") == "json_schema":
            return json_schema
        return {"type": "json_schema", "json_schema": {"name": getattr(json_schema, "__name__", "schema"),
                                                       "schema": json_schema}}
    return response_format
