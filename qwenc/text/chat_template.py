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

import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from ..errors import ChatTemplateError

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


def _make_environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _TemplateNamespace
    env.globals["dict"] = _TemplateDict()
    return env


ENVIRONMENT = _make_environment()


@lru_cache(maxsize=64)
def compile_chat_template(template: str) -> jinja2.Template:
    """Compile once per distinct template string. Raises ChatTemplateError on a syntax error."""
    if not isinstance(template, str):
        raise TypeError(f"a chat template is a string, got {type(template).__name__}")
    try:
        return ENVIRONMENT.from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        message = f"invalid chat template (line {exc.lineno}): {exc.message}"
        raise ChatTemplateError(message) from None


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
    """Render a compiled template; any failure inside the template becomes ChatTemplateError."""
    try:
        return compiled.render(**variables)
    except _RaisedByTemplate as exc:
        raise ChatTemplateError(exc.message) from None
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"chat template failed: {exc}") from exc
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, ArithmeticError) as exc:
        # Python errors raised by operations inside the template, e.g. `'a' + none`.
        raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc


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
                raise ValueError(f"{origin}: chat_template entries must be {{'name', 'template'}} "
                                 f"pairs, got {item!r}")
            named[item["name"]] = item["template"]
        return named
    if isinstance(value, Mapping) and all(isinstance(v, str) for v in value.values()):
        return dict(value)
    raise ValueError(f"{origin}: chat_template must be a string or a list of named templates")


class ChatTemplate:
    """A model's chat template(s) plus the special tokens its tokenizer passes to them.

    `templates` maps names to template text; "default" is used unless a name is asked for, or
    tools are given and a "tool_use" template exists (the rule transformers follows).
    """

    def __init__(self, templates, special_tokens: Optional[Mapping] = None, origin: str = "given"):
        self.templates = {"default": templates} if isinstance(templates, str) else dict(templates)
        if not self.templates:
            raise ValueError(f"{origin}: no chat template")
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
            with open(config, encoding="utf-8") as f:
                config = json.load(f)
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
        config = {}
        if config_path.is_file():
            with open(config_path, encoding="utf-8") as f:
                config = json.load(f)
        files = {}
        jinja_path = model_dir / "chat_template.jinja"
        if jinja_path.is_file():
            files["default"] = jinja_path.read_text(encoding="utf-8")
        extra_dir = model_dir / "additional_chat_templates"
        if extra_dir.is_dir():
            for path in sorted(extra_dir.glob("*.jinja")):
                files[path.name[:-len(".jinja")]] = path.read_text(encoding="utf-8")
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
        templates = {"default": template}
        for name in metadata.get("tokenizer.chat_templates") or ():
            named = metadata.get(f"tokenizer.chat_template.{name}")
            if named is not None:
                templates[name] = named
        tokens = metadata.get("tokenizer.ggml.tokens")
        specials = {}
        names = ["eos", "unk", "padding"]
        if metadata.get("tokenizer.ggml.add_bos_token"):
            names.append("bos")
        for name in names:
            token_id = metadata.get(f"tokenizer.ggml.{name}_token_id")
            if tokens is not None and token_id is not None and 0 <= int(token_id) < len(tokens):
                specials[f"{name[:3]}_token"] = str(tokens[int(token_id)])
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
