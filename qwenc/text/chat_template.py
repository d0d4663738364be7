"""Chat templates: turning a list of messages into the prompt text the model was trained on.

A chat template is a Jinja program shipped with the model. To get the same prompt as
transformers' `apply_chat_template(..., tokenize=False)`, the template must run in the same kind
of environment, with the same inputs:

- a sandboxed, immutable Jinja environment (templates come from the internet: they must not reach
  Python internals or mutate the caller's messages), with `trim_blocks` and `lstrip_blocks` on
  (templates are indented for readability and rely on these to drop that whitespace), and the
  `loopcontrols` extension (`{% break %}`, `{% continue %}`);
- a `tojson` filter that is plain `json.dumps` with `ensure_ascii=False` (Jinja's own filter
  escapes `<`, `>`, `&`, `'` for HTML, which would change the prompt), accepting `indent`,
  `separators` and `sort_keys`;
- the globals `raise_exception(msg)` and `strftime_now(fmt)`, and a `{% generation %}` block tag
  (used by templates that mark assistant text for training masks; here it renders its body);
- messages with `None`-valued keys dropped, and a message's reasoning under any of
  `reasoning_content` / `thinking` / `reasoning` also offered under the other standard names;
- `messages`, `tools`, `documents`, `add_generation_prompt`, the tokenizer's special tokens
  (`bos_token`, `eos_token`, ... when set) and any extra keyword (e.g. Qwen3's `enable_thinking`)
  as template variables.

`render_chat_template` does that for one template string. `ChatTemplate` picks the template of a
model (from `chat_template.jinja`, `tokenizer_config.json` or GGUF metadata) and falls back to
plain ChatML when a model ships none.
"""
from __future__ import annotations

import contextvars
import dataclasses
import functools
import json
import re
import time
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer

from ..errors import ChatTemplateError
from ..formats.jsonfile import read_json

# The fallback for models without a template: ChatML, the format Qwen models are trained on.
# Each message becomes `<|im_start|>{role}\n{content}<|im_end|>\n`; non-string content (e.g. a
# list of multimodal parts) renders as empty, and tool calls are not rendered. No default system
# prompt is added.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Names a message's reasoning may be given under; the first is the one chat templates read.
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")

# Special tokens a tokenizer passes to its template when they are set.
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token")


class _RaisedByTemplate(jinja2.TemplateError):
    """What `raise_exception(msg)` throws, so its message reaches the caller unchanged."""


# --------------------------------------------------------------------------------------------
# The Jinja environment
# --------------------------------------------------------------------------------------------

class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` renders its body unchanged.

    The body is compiled as a call block (like a macro body), so a `set` inside it stays local to
    it, as in transformers, where this tag records the assistant spans for training masks.
    """
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


class _TemplateNamespace(Namespace):
    """`namespace(...)` that refuses underscore names, which could shadow its internals."""

    def __init__(*args, **kwargs):  # no named `self`, so `namespace(self=1)` still works
        ns, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _check_namespace_name(name)
        Namespace.__init__(ns, attrs)

    def __setitem__(self, name, value):
        _check_namespace_name(name)
        Namespace.__setitem__(self, name, value)


def _check_namespace_name(name):
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(
            f"chat templates may not set underscore attributes on a namespace: {name!r}")


class _TemplateDict:
    """The template's `dict`: building dicts only, not the `dict` type itself."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Plain JSON, unlike Jinja's HTML-safe filter; ensure_ascii=False keeps non-ASCII text as is.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message):
    raise _RaisedByTemplate(message)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


def _lipsum(n=5, html=True, min=20, max=100):  # noqa: A002 (Jinja's own parameter names)
    """Jinja's lorem-ipsum global, refused before it writes more than a value may hold (it
    runs in one call, between two budget checks)."""
    if not all(isinstance(v, int) for v in (n, min, max)) or n * max * 16 > MAX_VALUE_CHARS:
        raise _TooCostly(f"lipsum({n!r}, ...) would build more than {MAX_VALUE_CHARS} characters"[:200])
    from jinja2.utils import generate_lorem_ipsum
    return generate_lorem_ipsum(n=n, html=html, min=min, max=max)


# --------------------------------------------------------------------------------------------
# Bounded rendering
# --------------------------------------------------------------------------------------------
# A template is a program from the internet; the sandbox keeps it from Python's internals but not
# from running forever or building a string of gigabytes. So every render has a budget: steps
# (loop iterations, calls, attribute and item reads, operators), seconds, and the size of what it
# outputs; and no operation may build a value (string, list, int) past a size limit, checked
# before the operation runs wherever its result size is known in advance. Real chat templates use
# a tiny part of each: Qwen3's renders a 20-message conversation in about a thousand steps.

MAX_STEPS = 1_000_000
MAX_SECONDS = 10.0
MAX_OUTPUT_CHARS = 32 << 20
MAX_VALUE_CHARS = 32 << 20      # characters in one value (a list's: its items', counted through)
MAX_PRODUCED_CHARS = 512 << 20  # characters of all the values a render builds, added up
MAX_INT_BITS = 1 << 16
MAX_TEMPLATE_CHARS = 1 << 20    # template source (Qwen's longest is ~5,000 characters)


class _TooCostly(jinja2.TemplateError):
    """A render that went past its budget."""


class _Budget:
    def __init__(self):
        self.steps = 0
        self.deadline = time.monotonic() + MAX_SECONDS
        # id -> (container, its size): the sandbox forbids mutating lists and dicts, so a
        # container's size, once known, stays true (the reference keeps the id from being reused)
        self.sizes = {}
        self.produced = 0  # characters built so far (bounds what many values can hold together)

    def tick(self, n=1):
        self.steps += n
        if self.steps > MAX_STEPS:
            raise _TooCostly(f"chat template ran more than {MAX_STEPS} steps (a loop that does not end?)")
        if not self.steps & 1023 and time.monotonic() > self.deadline:
            raise _TooCostly(f"chat template ran longer than {MAX_SECONDS:g} s")


_budget: contextvars.ContextVar = contextvars.ContextVar("qwenc_template_budget", default=None)


def _tick(n=1):
    budget = _budget.get()
    if budget is not None:  # outside a render: Jinja folding constants at compile time
        budget.tick(n)


def _approx_chars(value, limit=MAX_VALUE_CHARS) -> int:
    """Characters `value` holds (strings in lists and dicts counted where they occur), stopping
    once past `limit`; 8 for each scalar. A container's size is remembered for the render."""
    if isinstance(value, str):
        return len(value)
    if not isinstance(value, (list, tuple, dict)):
        return 8
    budget = _budget.get()
    known = budget.sizes.get(id(value)) if budget is not None else None
    if known is not None and known[0] is value:
        return known[1]
    total = 2 + 2 * len(value)
    for v in (value if not isinstance(value, dict) else [*value.keys(), *value.values()]):
        if total > limit:
            break
        total += _approx_chars(v, limit) if isinstance(v, (str, list, tuple, dict)) else 8
    _remember(value, total)
    return total


def _remember(value, size):
    budget = _budget.get()
    if budget is not None and isinstance(value, (list, tuple, dict)):
        budget.sizes[id(value)] = (value, size)


def _check_size(chars, what):
    if chars > MAX_VALUE_CHARS:
        raise _TooCostly(f"chat template built a value of more than {MAX_VALUE_CHARS} characters ({what})")


def _check_result(value, what):
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
        raise _TooCostly(f"chat template built an integer of more than {MAX_INT_BITS} bits ({what})")
    size = _approx_chars(value)
    _check_size(size, what)
    budget = _budget.get()
    if budget is not None and isinstance(value, (str, list, tuple, dict)):
        budget.produced += size
        if budget.produced > MAX_PRODUCED_CHARS:
            raise _TooCostly(f"chat template built more than {MAX_PRODUCED_CHARS} characters in all")
    return value


def _int_arg(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _format_cost(fmt: str, args) -> int:
    """An upper bound on the length of fmt % args or fmt.format(*args): each field as long as
    the longest argument, plus every number in fmt (a width) and, with `*` widths, in args."""
    values = list(args.values()) if isinstance(args, dict) else list(args) if isinstance(args, (list, tuple)) else [args]
    longest = max((_approx_chars(v) for v in values), default=0)
    widths = sum(int(d) for d in re.findall(r"\d{1,12}", fmt))
    if "*" in fmt:
        widths += sum(abs(_int_arg(v)) for v in values)
    return len(fmt) + (fmt.count("%") + fmt.count("{")) * longest + widths


def _str_method_cost(obj: str, name: str, args, kwargs):
    """An upper bound on the result length of a str method that can grow its string, or None."""
    a = list(args) + list(kwargs.values())
    n = len(obj)
    if name in ("center", "ljust", "rjust", "zfill"):
        return max(n, _int_arg(a[0]) if a else 0)
    if name == "expandtabs":
        return n * max(1, _int_arg(a[0]) if a else 8)
    if name == "replace" and len(a) >= 2 and isinstance(a[0], str) and isinstance(a[1], str):
        return n + (n // max(len(a[0]), 1) + 1) * len(a[1])
    if name == "join" and a and isinstance(a[0], (list, tuple)):
        return _approx_chars(a[0]) + n * len(a[0])
    if name in ("format", "format_map"):
        return _format_cost(obj, a[0] if name == "format_map" and a else a)
    return None


def _guarded_binop(op, left, right):
    size = None
    if op == "*":
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and isinstance(times, int):
                size = _approx_chars(seq) * max(times, 0)
                _check_size(size, "repetition")
        if isinstance(left, int) and isinstance(right, int) and \
                left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise _TooCostly(f"chat template built an integer of more than {MAX_INT_BITS} bits")
    elif op == "**":
        if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and \
                right > 0 and left.bit_length() * right > MAX_INT_BITS:
            raise _TooCostly(f"chat template built an integer of more than {MAX_INT_BITS} bits")
    elif op == "+":
        if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
            size = _approx_chars(left) + _approx_chars(right)
            _check_size(size, "concatenation")
    elif op == "%" and isinstance(left, str):
        _check_size(_format_cost(left, right), "% formatting")
    result = ImmutableSandboxedEnvironment.default_binop_table[op](left, right)
    if size is not None:
        _remember(result, size)  # known without walking the result
    return _check_result(result, op)


# Filters whose result can outgrow their input, with a bound on its size computed first.
def _filter_cost(name, value, args, kwargs):
    a = list(args) + list(kwargs.values())
    size = _approx_chars(value)
    if name == "indent":
        width = a[0] if a else 4
        width = len(width) if isinstance(width, str) else _int_arg(width)
        return size + (str(value).count("\n") + 1 if isinstance(value, str) else size) * width
    if name == "center":
        return max(size, _int_arg(a[0]) if a else 80)
    if name == "join" and isinstance(value, (list, tuple)):
        sep = a[0] if a and isinstance(a[0], str) else ""
        return size + len(sep) * len(value)
    if name == "replace" and len(a) >= 2 and isinstance(value, str):
        old, new = str(a[0]), str(a[1])
        return size + (size // max(len(old), 1) + 1) * len(new)
    if name == "format" and isinstance(value, str):
        return _format_cost(value, a)
    if name == "tojson":
        indent = kwargs.get("indent", a[1] if len(a) > 1 else None)
        return size * (2 + 8 * max(_int_arg(indent), 0)) if indent else 2 * size + 64
    if name == "wordwrap":
        return 2 * size + 64
    return None


def _materialized(value):
    """A list of what an iterator (map's, range, ...) yields, counted against the budget, so
    that what is built from it can be sized first."""
    if isinstance(value, (str, list, tuple, dict)) or not hasattr(value, "__iter__"):
        return value
    out = []
    for item in value:
        _tick()
        out.append(item)
    return out


def _guard_filter(name, func):
    @functools.wraps(func)  # keeps jinja_pass_arg, which says what the first argument is
    def guarded(*args, **kwargs):
        _tick()
        skip = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0
        if len(args) > skip:
            if name == "join":
                args = args[:skip] + (_materialized(args[skip]),) + args[skip + 1:]
            cost = _filter_cost(name, args[skip], args[skip + 1:], kwargs)
            if cost is not None:
                _check_size(cost, f"filter {name}")
        return _check_result(func(*args, **kwargs), f"filter {name}")
    return guarded


def _guarded_iter(iterable):
    """What every `{% for %}` loops over: counts its iterations against the budget."""
    for item in iterable:
        _tick()
        yield item


def _guarded_concat(parts):
    """`a ~ b ~ ...` (Jinja's str_join), with the size of the result checked first."""
    strings = [p if isinstance(p, str) else str(p) for p in parts]
    _check_size(sum(len(p) for p in strings), "~ concatenation")
    return "".join(strings)


class _Guards(NodeTransformer):
    """Rewrites a parsed template so that its loops and `~` go through the budget."""

    def visit_For(self, node):
        node = self.generic_visit(node)
        node.iter = nodes.Call(nodes.EnvironmentAttribute("guarded_iter"), [node.iter], [], None, None,
                               lineno=node.lineno)
        return node

    def visit_Concat(self, node):
        node = self.generic_visit(node)
        return nodes.Call(nodes.EnvironmentAttribute("guarded_concat"), [nodes.List(node.nodes, lineno=node.lineno)],
                          [], None, None, lineno=node.lineno)


class _TemplateEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with every operation that can loop or grow a value counted and bounded."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})
    guarded_iter = staticmethod(_guarded_iter)
    guarded_concat = staticmethod(_guarded_concat)

    def _parse(self, source, name, filename):
        tree = _Guards().visit(super()._parse(source, name, filename))
        return tree.set_environment(self)

    def call_binop(self, context, operator, left, right):
        _tick()
        return _guarded_binop(operator, left, right)

    def getattr(self, obj, attribute):
        _tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj, argument):
        _tick()
        return super().getitem(obj, argument)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (Jinja's own signature)
        _tick()
        owner = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)
        if isinstance(owner, str) and getattr(__obj, "__name__", "") == "join" and args:
            args = (_materialized(args[0]),) + args[1:]
        if isinstance(owner, str):
            cost = _str_method_cost(owner, getattr(__obj, "__name__", ""), args, kwargs)
            if cost is not None:
                _check_size(cost, f"str.{__obj.__name__}")
        for v in args:
            if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > MAX_INT_BITS:
                raise _TooCostly("chat template passed a huge integer")
        return _check_result(super().call(__context, __obj, *args, **kwargs), "a call")


def _make_environment() -> ImmutableSandboxedEnvironment:
    env = _TemplateEnvironment(trim_blocks=True, lstrip_blocks=True,
                               extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.filters = {name: _guard_filter(name, f) for name, f in env.filters.items()}
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["lipsum"] = _lipsum
    env.globals["namespace"] = _TemplateNamespace
    env.globals["dict"] = _TemplateDict()
    return env


ENVIRONMENT = _make_environment()


@lru_cache(maxsize=64)
def compile_chat_template(template: str) -> jinja2.Template:
    """Compile once per distinct template string. Raises ChatTemplateError on a syntax error."""
    if not isinstance(template, str):
        raise TypeError(f"a chat template is a string, got {type(template).__name__}")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise ChatTemplateError(f"invalid chat template: {len(template)} characters, more than "
                                f"{MAX_TEMPLATE_CHARS}")
    try:
        return ENVIRONMENT.from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        message = f"invalid chat template (line {exc.lineno}): {exc.message}"
        raise ChatTemplateError(message) from None
    except (RecursionError, MemoryError, SyntaxError, ValueError, TypeError) as exc:
        # Nesting too deep for the parser or for Python's compiler, or a literal it cannot take.
        raise ChatTemplateError(f"invalid chat template: {type(exc).__name__}: {exc}"[:300]) from None


# --------------------------------------------------------------------------------------------
# Template inputs
# --------------------------------------------------------------------------------------------

def _plain(value: Any) -> Any:
    """A fresh copy of `value` built from plain JSON-like types only.

    Templates run sandboxed, but a sandbox only knows the dangers of the types it expects; a rich
    object (an array, an image, a str subclass) could carry methods it does not know about. So
    the template sees plain copies, and anything unknown becomes an inert `<TypeName>` string.
    The copy also keeps the caller's messages untouched by what we add below.
    """
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        return _plain(value.item())  # numpy scalars: np.bool_(False) must stay falsy
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):  # pydantic models, e.g. OpenAI SDK messages
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def _as_message_dict(message: Any) -> dict:
    if dataclasses.is_dataclass(message) and not isinstance(message, type):
        message = {f.name: getattr(message, f.name) for f in dataclasses.fields(message)}
    elif callable(getattr(message, "model_dump", None)):
        message = message.model_dump()
    if not isinstance(message, Mapping):
        raise TypeError(f"chat messages must be dicts, got {message!r}")
    return message


def _prepare_message(message: Any) -> dict:
    # Keys set to None are dropped: APIs send `content: null` or `tool_calls: null`, and templates
    # handle a missing key but would render the literal "None" or fail on a None value.
    message = _plain({k: v for k, v in _as_message_dict(message).items() if v is not None})
    reasoning = next((message[k] for k in _REASONING_KEYS if message.get(k) is not None), None)
    if reasoning is not None:
        # Offer the reasoning under the standard name (which Qwen3 reads) and under `thinking`
        # (which other templates read), keeping an explicit `thinking` if the caller gave one.
        message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    return message


def _prepare_tools(tools) -> Optional[list]:
    if tools is None:
        return None
    for tool in tools:
        if not isinstance(tool, Mapping):
            raise TypeError("tools must be given as JSON-schema dicts, e.g. {'type': 'function', "
                            f"'function': {{'name': ..., 'parameters': ...}}}}; got {tool!r}")
    return _plain(list(tools))


def _prepare_documents(documents) -> Optional[list]:
    if documents is None:
        return None
    for document in documents:
        if not isinstance(document, Mapping):
            raise TypeError("documents must be dicts (e.g. with 'title' and 'text'), "
                            f"got {document!r}")
    return _plain(list(documents))


def template_variables(messages, add_generation_prompt=False, tools=None, documents=None,
                       bos_token=None, eos_token=None, **template_kwargs) -> dict:
    """Everything a chat template sees, prepared as transformers prepares it."""
    messages = list(messages)
    if not messages:
        raise ValueError("cannot render an empty conversation: give at least one message")
    variables = {
        "messages": [_prepare_message(m) for m in messages],
        "tools": _prepare_tools(tools),
        "documents": _prepare_documents(documents),
        "add_generation_prompt": add_generation_prompt,
    }
    # Special tokens only when set (an unset one stays undefined to the template); explicit
    # keywords win over them.
    specials = {"bos_token": bos_token, "eos_token": eos_token}
    variables.update({k: v for k, v in specials.items() if v is not None})
    variables.update(_plain(template_kwargs))
    return variables


def render_compiled(compiled: jinja2.Template, variables: dict) -> str:
    """Render a compiled template within the budget (see "Bounded rendering"); any failure
    inside the template becomes ChatTemplateError."""
    token = _budget.set(_Budget())
    try:
        out, size = [], 0
        for chunk in compiled.generate(**variables):
            size += len(chunk)
            if size > MAX_OUTPUT_CHARS:
                raise _TooCostly(f"chat template output more than {MAX_OUTPUT_CHARS} characters")
            out.append(chunk)
        return "".join(out)
    except _RaisedByTemplate as exc:
        raise ChatTemplateError(exc.message) from None
    except _TooCostly as exc:
        raise ChatTemplateError(exc.message) from None
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"chat template failed: {exc}") from exc
    except RecursionError:
        raise ChatTemplateError("chat template failed: recursion too deep (a macro calling itself?)") from None
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, ArithmeticError) as exc:
        # Python errors raised by operations inside the template, e.g. `'a' + none`.
        raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}"[:500]) from exc
    finally:
        _budget.reset(token)


def render_chat_template(template: str, messages: list, add_generation_prompt: bool = False,
                         tools=None, documents=None, bos_token=None, eos_token=None,
                         **template_kwargs) -> str:
    """Render `messages` with the Jinja chat `template`, exactly as transformers'
    `apply_chat_template(messages, tokenize=False, ...)` does.

    `tools` are JSON-schema dicts (Python callables are not converted: pass their schema).
    `bos_token`/`eos_token` are what the tokenizer would pass; extra keywords (such as Qwen3's
    `enable_thinking=False`) become template variables. Raises ChatTemplateError (a ValueError)
    when the template does not compile or fails, carrying the template's own message for
    `raise_exception(...)`.
    """
    compiled = compile_chat_template(template)
    variables = template_variables(messages, add_generation_prompt, tools, documents,
                                   bos_token, eos_token, **template_kwargs)
    return render_compiled(compiled, variables)


# --------------------------------------------------------------------------------------------
# Where a model's template comes from
# --------------------------------------------------------------------------------------------

def _token_text(value) -> Optional[str]:
    """A special token in tokenizer_config.json: a string, or an AddedToken dict with 'content'."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _named_templates(value, origin: str) -> dict:
    """tokenizer_config.json's `chat_template`: a string, or a list of {name, template}."""
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list):
        named = {}
        for item in value:
            if not (isinstance(item, Mapping) and isinstance(item.get("name"), str)
                    and isinstance(item.get("template"), str)):
                raise ChatTemplateError(f"{origin}: chat_template entries must be {{'name', 'template'}} "
                                        f"pairs, got {item!r}"[:300])
            named[item["name"]] = item["template"]
        return named
    if isinstance(value, Mapping) and all(isinstance(v, str) for v in value.values()):
        return dict(value)
    raise ChatTemplateError(f"{origin}: chat_template must be a string or a list of named templates")


def _has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _read_template(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ChatTemplateError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ChatTemplateError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


class ChatTemplate:
    """A model's chat template(s) plus the special tokens its tokenizer passes to them.

    `templates` maps names to template text; "default" is used unless a name is asked for, or
    tools are given and a "tool_use" template exists (the rule transformers follows).
    """

    def __init__(self, templates, special_tokens: Optional[Mapping] = None, origin: str = "given"):
        self.templates = {"default": templates} if isinstance(templates, str) else dict(templates)
        if not self.templates:
            raise ChatTemplateError(f"{origin}: no chat template")
        for name, text in self.templates.items():
            # Compiled now, so that a template that does not parse is refused with the model
            # rather than at its first conversation.
            if not isinstance(text, str) or _has_surrogates(text):
                raise ChatTemplateError(f"{origin}: chat template {name!r} is not UTF-8 text")
            try:
                compile_chat_template(text)
            except ChatTemplateError as exc:
                raise ChatTemplateError(f"{origin}: chat template {name!r}: {exc}"[:500]) from None
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        self.origin = origin  # where it was read from, for messages and for `is_fallback`

    def __repr__(self):
        return f"ChatTemplate({sorted(self.templates)}, origin={self.origin!r})"

    @property
    def is_fallback(self) -> bool:
        return self.origin == "ChatML fallback"

    def select(self, name: Optional[str] = None, tools=None) -> str:
        if name is not None:
            if name not in self.templates:
                raise ValueError(f"no chat template named {name!r}; have {sorted(self.templates)}")
            return self.templates[name]
        if tools is not None and "tool_use" in self.templates:
            return self.templates["tool_use"]
        if "default" in self.templates:
            return self.templates["default"]
        if len(self.templates) == 1:
            return next(iter(self.templates.values()))
        raise ValueError(f"{self.origin}: several chat templates and none named 'default'; "
                         f"pick one of {sorted(self.templates)}")

    def render(self, messages, add_generation_prompt: bool = False, tools=None, documents=None,
               name: Optional[str] = None, **template_kwargs) -> str:
        kwargs = {**self.special_tokens, **template_kwargs}
        return render_chat_template(self.select(name, tools), messages, add_generation_prompt,
                                    tools, documents, **kwargs)

    # -- constructors ------------------------------------------------------------------------

    @classmethod
    def chatml(cls) -> "ChatTemplate":
        return cls(CHATML_TEMPLATE, origin="ChatML fallback")

    @classmethod
    def from_tokenizer_config(cls, config, origin: str = "tokenizer_config.json"):
        """From a parsed tokenizer_config.json (or its path); None when it has no template."""
        if not isinstance(config, Mapping):
            origin = str(config)
            config = read_json(config, ChatTemplateError)
        if config.get("chat_template") is None:
            return None
        specials = {name: _token_text(config.get(name)) for name in SPECIAL_TOKEN_NAMES}
        return cls(_named_templates(config["chat_template"], origin), specials, origin)

    @classmethod
    def from_model_dir(cls, model_dir):
        """From a HuggingFace model directory; None when it ships no template.

        As in transformers, `chat_template.jinja` (plus named ones in `additional_chat_templates/`)
        wins over the `chat_template` field of tokenizer_config.json; the special tokens always
        come from tokenizer_config.json.
        """
        model_dir = Path(model_dir)
        config_path = model_dir / "tokenizer_config.json"
        config = read_json(config_path, ChatTemplateError) if config_path.is_file() else {}
        files = {}
        jinja_path = model_dir / "chat_template.jinja"
        if jinja_path.is_file():
            files["default"] = _read_template(jinja_path)
        extra_dir = model_dir / "additional_chat_templates"
        if extra_dir.is_dir():
            for path in sorted(extra_dir.glob("*.jinja")):
                files[path.name[:-len(".jinja")]] = _read_template(path)
        if files:
            config = {**config, "chat_template": files}
        return cls.from_tokenizer_config(config, origin=str(jinja_path if files else config_path))

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping, origin: str = "GGUF metadata"):
        """From a GGUF file's metadata (key -> decoded value); None when it has no template.

        Reads `tokenizer.chat_template` (plus named `tokenizer.chat_template.<name>` listed in
        `tokenizer.chat_templates`), and takes the special tokens' text from the vocabulary.
        A GGUF records a BOS id even for models whose tokenizer has no BOS (Qwen's is
        `<|endoftext|>`, while its tokenizer_config.json says null), so `bos_token` is passed
        only when `tokenizer.ggml.add_bos_token` is true, which matches the HF tokenizer.
        """
        template = metadata.get("tokenizer.chat_template")
        if template is None:
            return None
        if not isinstance(template, str):
            raise ChatTemplateError(f"{origin}: tokenizer.chat_template is not a string")
        templates = {"default": template}
        names = metadata.get("tokenizer.chat_templates", [])
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            raise ChatTemplateError(f"{origin}: tokenizer.chat_templates is not a list of names")
        for name in names:
            named = metadata.get(f"tokenizer.chat_template.{name}")
            if named is not None:
                templates[name] = named
        tokens = metadata.get("tokenizer.ggml.tokens")
        specials = {}
        names = ["eos", "unk", "padding"]
        if metadata.get("tokenizer.ggml.add_bos_token") is True:
            names.append("bos")
        for name in names:
            token_id = metadata.get(f"tokenizer.ggml.{name}_token_id")
            if isinstance(tokens, list) and isinstance(token_id, int) and 0 <= token_id < len(tokens):
                specials[f"{name[:3]}_token"] = str(tokens[token_id])
        return cls(templates, specials, origin)

    @classmethod
    def load(cls, model_path=None, gguf_metadata: Optional[Mapping] = None) -> "ChatTemplate":
        """The template for a model: from its GGUF metadata when given, else from the model
        directory `model_path`, else the ChatML fallback (check `is_fallback`)."""
        found = None
        if gguf_metadata is not None:
            found = cls.from_gguf_metadata(gguf_metadata)
        if found is None and model_path is not None and Path(model_path).is_dir():
            found = cls.from_model_dir(model_path)
        return found if found is not None else cls.chatml()


__all__ = ["render_chat_template", "compile_chat_template", "template_variables", "render_compiled",
           "ChatTemplate", "ChatTemplateError", "CHATML_TEMPLATE", "ENVIRONMENT"]
