"""Chat templates render exactly as transformers' apply_chat_template(..., tokenize=False) does.

The oracle is a real transformers tokenizer (built on a one-word vocabulary, since rendering never
tokenizes) given the published Qwen2.5 and Qwen3 templates from tests/data/templates/.
"""
import copy
import datetime
import json
from pathlib import Path

import pytest

from qwenc.text.chat_template import (CHATML_TEMPLATE, ENVIRONMENT, ChatTemplate, ChatTemplateError,
                                 compile_chat_template, render_chat_template, render_compiled,
                                 template_variables)

TEMPLATE_DIR = Path(__file__).parent / "data" / "templates"
TEMPLATES = {name: (TEMPLATE_DIR / f"{name}.jinja").read_text(encoding="utf-8")
             for name in ("qwen2.5", "qwen3")}

# --------------------------------------------------------------------------------------------
# The oracle
# --------------------------------------------------------------------------------------------


def _make_hf_tokenizer(**special_tokens):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0}
    for i, token in enumerate(special_tokens.values(), start=1):
        vocab[token] = i
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=core, **special_tokens)


@pytest.fixture(scope="module")
def hf():
    tokenizer = _make_hf_tokenizer()

    def render(template, messages, **kwargs):
        tokenizer.chat_template = template
        return tokenizer.apply_chat_template(copy.deepcopy(messages), tokenize=False, **kwargs)
    return render


# --------------------------------------------------------------------------------------------
# Conversations
# --------------------------------------------------------------------------------------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city — in °C, with \"quotes\" & <angle> brackets",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich or 東京"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {"name": "search", "description": "Search the web",
                 "parameters": {"type": "object", "properties": {"q": {"type": "string"},
                                                                 "k": {"type": "integer"}}}},
}


def _call(name, arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATIONS = {
    "single_user": dict(messages=[{"role": "user", "content": "Hello!"}]),
    "system_user": dict(messages=[
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is 2+2?"}]),
    "multi_turn": dict(messages=[
        {"role": "system", "content": "Be helpful."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the chicken cross the road?"},
        {"role": "user", "content": "Why?"}]),
    "think_in_history": dict(messages=[
        {"role": "user", "content": "What is 3*7?"},
        {"role": "assistant", "content": "<think>\n3 times 7 is 21.\n</think>\n\n21"},
        {"role": "user", "content": "And 3*8?"}]),
    "think_last_assistant": dict(messages=[
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "<think>\nEasy one.\n</think>\n\nParis."}]),
    "reasoning_content_field": dict(messages=[
        {"role": "user", "content": "Is 91 prime?"},
        {"role": "assistant", "content": "No: 91 = 7 × 13.",
         "reasoning_content": "Try small primes: 7 × 13 = 91."}]),
    "thinking_alias_field": dict(messages=[
        {"role": "user", "content": "Is 97 prime?"},
        {"role": "assistant", "content": "Yes.", "thinking": "No divisor up to 9."},
        {"role": "user", "content": "Sure?"}]),
    "tools_query": dict(tools=[WEATHER_TOOL, SEARCH_TOOL], messages=[
        {"role": "system", "content": "You can use tools."},
        {"role": "user", "content": "Weather in Zürich?"}]),
    "tool_call_round_trip": dict(tools=[WEATHER_TOOL], messages=[
        {"role": "user", "content": "Weather in Paris and 東京?"},
        {"role": "assistant", "content": "",
         "tool_calls": [_call("get_weather", {"city": "Paris"}),
                        _call("get_weather", {"city": "東京", "unit": "celsius"})]},
        {"role": "tool", "content": "{\"temp\": 18}"},
        {"role": "tool", "content": "{\"temp\": 24}"},
        {"role": "assistant", "content": "Paris 18 °C, 東京 24 °C."}]),
    "tool_call_with_text_and_string_args": dict(tools=[SEARCH_TOOL], messages=[
        {"role": "system", "content": "Agent mode."},
        {"role": "user", "content": "Find qwenc"},
        {"role": "assistant", "content": "<think>\nSearch first.\n</think>\n\nLet me search.",
         "tool_calls": [_call("search", {"q": "qwenc", "k": 3})]},
        {"role": "tool", "content": "no results"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"function": {"name": "search", "arguments": {"q": "qwenc github"}}}]},
        {"role": "tool", "content": "1 result"}]),
    "unicode": dict(messages=[
        {"role": "system", "content": "Réponds en français. 🙂"},
        {"role": "user",
         "content": "日本語と中文と한국어, العربية, e\u0301 (combining), \U0001F9D1\u200D\U0001F4BB"},
        {"role": "assistant", "content": "Ça marche ✓ — «ok»\n\ttabs\r\nand CRLF"},
        {"role": "user", "content": "Emoji only: 🐍🦀"}]),
    "empty_contents": dict(messages=[
        {"role": "system", "content": ""},
        {"role": "user", "content": ""},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "   "}]),
    "user_looks_like_tool_response": dict(messages=[
        {"role": "user", "content": "Real question"},
        {"role": "assistant", "content": "<think>\nr1\n</think>\n\na1"},
        {"role": "user", "content": "<tool_response>\nfake\n</tool_response>"},
        {"role": "assistant", "content": "<think>r2</think>a2"}]),
    "literal_special_tokens_in_text": dict(messages=[
        {"role": "user", "content": "Print '<|im_end|>' and {{ not_jinja }} and {% raw %}"}]),
    "system_only": dict(messages=[{"role": "system", "content": "Only a system prompt."}]),
}

CASES = [(conv, template, agp, thinking)
         for conv in CONVERSATIONS
         for template in TEMPLATES
         for agp in (False, True)
         for thinking in (None, True, False)]


def _kwargs(conv, agp, thinking):
    case = CONVERSATIONS[conv]
    kwargs = {"add_generation_prompt": agp}
    if "tools" in case:
        kwargs["tools"] = case["tools"]
    if thinking is not None:
        kwargs["enable_thinking"] = thinking
    return case["messages"], kwargs


@pytest.mark.parametrize("conv,template,agp,thinking", CASES)
def test_matches_transformers(hf, conv, template, agp, thinking):
    messages, kwargs = _kwargs(conv, agp, thinking)
    before = copy.deepcopy(messages)
    ours = render_chat_template(TEMPLATES[template], messages, **kwargs)
    assert ours == hf(TEMPLATES[template], messages, **kwargs)
    assert messages == before  # the caller's messages are never modified


def test_qwen3_behaviour_is_really_exercised():
    # Guard against a vacuous comparison: the cases above must hit the template's branches.
    q3 = TEMPLATES["qwen3"]
    msgs = CONVERSATIONS["think_in_history"]["messages"]
    out = render_chat_template(q3, msgs, add_generation_prompt=True, enable_thinking=False)
    assert "3 times 7" not in out  # earlier turns' reasoning is dropped
    assert out.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    out = render_chat_template(q3, CONVERSATIONS["reasoning_content_field"]["messages"])
    assert "<think>\nTry small primes: 7 × 13 = 91.\n</think>\n\nNo: 91 = 7 × 13." in out
    out = render_chat_template(TEMPLATES["qwen2.5"], CONVERSATIONS["single_user"]["messages"])
    assert out.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.")
    case = CONVERSATIONS["tools_query"]
    out = render_chat_template(q3, case["messages"], tools=case["tools"])
    assert '"description": "City name, e.g. Zürich or 東京"' in out  # ensure_ascii=False


# --------------------------------------------------------------------------------------------
# Falsifiers: a differently configured environment must be caught by the comparison above
# --------------------------------------------------------------------------------------------

def _render_with(env, template, messages, **kwargs):
    return render_compiled(env.from_string(template), template_variables(messages, **kwargs))


def _differs_somewhere(hf, env):
    for conv, template, agp, thinking in CASES:
        messages, kwargs = _kwargs(conv, agp, thinking)
        if _render_with(env, TEMPLATES[template], messages, **kwargs) != hf(TEMPLATES[template],
                                                                             messages, **kwargs):
            return True
    return False


def test_ascii_escaping_tojson_is_caught(hf):
    env = ENVIRONMENT.overlay()
    env.filters = dict(env.filters)
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, **{**kw, "ensure_ascii": True})
    assert _differs_somewhere(hf, env)


def test_jinja_builtin_tojson_is_caught(hf):
    import jinja2.filters

    env = ENVIRONMENT.overlay()
    env.filters = dict(env.filters)
    env.filters["tojson"] = jinja2.filters.FILTERS["tojson"]  # HTML-escapes <, >, &, '
    assert _differs_somewhere(hf, env)


def test_whitespace_options_are_caught(hf):
    # The Qwen templates strip whitespace by hand ({%- ... %}); a template relying on
    # trim_blocks/lstrip_blocks, as many do, shows the difference.
    template = ("{% for m in messages %}\n    {% if m.role == 'user' %}\n"
                "U: {{ m.content }}\n    {% endif %}\n{% endfor %}")
    msgs = CONVERSATIONS["multi_turn"]["messages"]
    expected = hf(template, msgs)
    assert render_chat_template(template, msgs) == expected
    assert _render_with(ENVIRONMENT.overlay(trim_blocks=False), template, msgs) != expected
    assert _render_with(ENVIRONMENT.overlay(lstrip_blocks=False), template, msgs) != expected


# --------------------------------------------------------------------------------------------
# Environment details, each against the oracle
# --------------------------------------------------------------------------------------------

SMALL_TEMPLATES = {
    "tojson_options": "{{ tools | tojson(indent=2) }}|{{ tools | tojson(separators=(',', ':'), "
                      "sort_keys=true) }}|{{ messages[0] | tojson }}",
    "loopcontrols": "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
                    "{% if m.role == 'system' %}{% continue %}{% endif %}[{{ m.content }}]"
                    "{% endfor %}",
    "generation_tag": "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
                      "{% set x = 1 %}A:{{ m.content }}{% endgeneration %}{% else %}{{ m.role }}:"
                      "{{ m.content }}{% endif %}\n{% endfor %}{{ x is defined }}",
    "namespace_and_dict": "{% set ns = namespace(n=0, seen=dict(a=1)) %}{% for m in messages %}"
                          "{% set ns.n = ns.n + m.content | length %}{% endfor %}{{ ns.n }} "
                          "{{ ns.seen }} {{ dict.fromkeys(['x'], 0) }}",
    "special_tokens": "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}"
                      "{% endfor %}",
    "keys_seen": "{% for m in messages %}{{ m | dictsort | map('first') | join(',') }};"
                 "{% endfor %}",
    "documents": "{% for d in documents %}{{ d.title }}={{ d.text }};{% endfor %}",
}


@pytest.mark.parametrize("name", sorted(SMALL_TEMPLATES))
def test_environment_details_match_transformers(name):
    template = SMALL_TEMPLATES[name]
    tokenizer = _make_hf_tokenizer(bos_token="<s>", eos_token="</s>")
    tokenizer.chat_template = template
    messages = CONVERSATIONS["tool_call_with_text_and_string_args"]["messages"] + [
        {"role": "assistant", "content": "x", "reasoning": "via the 'reasoning' key"}]
    kwargs = dict(tools=[WEATHER_TOOL, SEARCH_TOOL],
                  documents=[{"title": "Doc", "text": "Text ü"}])
    expected = tokenizer.apply_chat_template(copy.deepcopy(messages), tokenize=False, **kwargs)
    assert render_chat_template(template, messages, bos_token="<s>", eos_token="</s>",
                                **kwargs) == expected


def test_strftime_now():
    out = render_chat_template("{{ strftime_now('%Y') }}", [{"role": "user", "content": ""}])
    assert out in {str(datetime.date.today().year), str(datetime.date.today().year + 1)}


def test_compiled_once():
    assert compile_chat_template(TEMPLATES["qwen3"]) is compile_chat_template(TEMPLATES["qwen3"])


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------

USER = [{"role": "user", "content": "hi"}]


def test_raise_exception_message_is_kept():
    with pytest.raises(ValueError) as info:
        render_chat_template("{{ raise_exception('Conversation roles must alternate') }}", USER)
    assert str(info.value) == "Conversation roles must alternate"


@pytest.mark.parametrize("template", ["{% if %}", "{% for m in messages %}", "{{ 1 + }}",
                                      "{% endgeneration %}"])
def test_syntax_error_is_value_error(template):
    with pytest.raises(ChatTemplateError, match="invalid chat template"):
        render_chat_template(template, USER)


@pytest.mark.parametrize("template", [
    "{{ messages[0].content + undefined_thing }}",   # undefined in an operation
    "{{ messages[5].content + 'x' }}",               # out-of-range index gives undefined
    "{{ 'a' + 1 }}",                                 # Python TypeError inside the template
    "{{ 1 // 0 }}",
])
def test_runtime_errors_are_value_errors(template):
    with pytest.raises(ValueError):
        render_chat_template(template, USER)


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__ }}",
    "{{ messages.append(1) }}",                    # immutable sandbox: no mutation of inputs
    "{% set ns = namespace(_hidden=1) %}",
    "{% set ns = namespace() %}{% set ns._x = 1 %}",
])
def test_sandbox(template):
    with pytest.raises(ChatTemplateError):
        render_chat_template(template, USER)


def test_bad_inputs():
    q3 = TEMPLATES["qwen3"]
    with pytest.raises(ValueError, match="empty conversation"):
        render_chat_template(q3, [])
    with pytest.raises(TypeError):
        render_chat_template(q3, ["just a string"])
    with pytest.raises(TypeError, match="JSON-schema"):
        render_chat_template(q3, USER, tools=[len])
    with pytest.raises(TypeError):
        render_chat_template(q3, USER, documents=["text"])


def test_qwen25_fails_cleanly_on_missing_content():
    # Qwen2.5 concatenates message.content: a None content (dropped, as in transformers) is an
    # error from the template, reported as ValueError rather than a crash inside Jinja.
    with pytest.raises(ValueError):
        render_chat_template(TEMPLATES["qwen2.5"], [{"role": "user", "content": None}])


# --------------------------------------------------------------------------------------------
# Template sources
# --------------------------------------------------------------------------------------------

def test_chatml_fallback(tmp_path, hf):
    template = ChatTemplate.load(tmp_path)  # an empty directory ships no template
    assert template.is_fallback
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
            {"role": "assistant", "content": None, "tool_calls": [_call("f", {})]}]
    out = template.render(msgs, add_generation_prompt=True)
    assert out == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
                   "<|im_start|>assistant\n<|im_end|>\n<|im_start|>assistant\n")
    assert out == hf(CHATML_TEMPLATE, msgs, add_generation_prompt=True)
    assert ChatTemplate.load(None).is_fallback


def _write_json(path, obj):
    path.write_text(json.dumps(obj), encoding="utf-8")


def test_from_tokenizer_config_string(tmp_path):
    _write_json(tmp_path / "tokenizer_config.json", {
        "chat_template": TEMPLATES["qwen3"], "bos_token": None,
        "eos_token": {"content": "<|im_end|>", "special": True}, "pad_token": "<|endoftext|>"})
    template = ChatTemplate.load(tmp_path)
    assert not template.is_fallback
    assert template.special_tokens == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    assert template.render(USER, add_generation_prompt=True, enable_thinking=False) == \
        render_chat_template(TEMPLATES["qwen3"], USER, add_generation_prompt=True,
                             enable_thinking=False)


def test_named_templates(tmp_path):
    config = {"chat_template": [{"name": "default", "template": "D{{ messages | length }}"},
                                {"name": "tool_use", "template": "T{{ tools | length }}"},
                                {"name": "rag", "template": "R{{ documents | length }}"}]}
    template = ChatTemplate.from_tokenizer_config(config)
    assert template.render(USER) == "D1"
    assert template.render(USER, tools=[SEARCH_TOOL]) == "T1"
    assert template.render(USER, name="rag", documents=[{"title": "t", "text": "x"}]) == "R1"
    with pytest.raises(ValueError, match="no chat template named"):
        template.render(USER, name="missing")
    no_default = ChatTemplate.from_tokenizer_config(
        {"chat_template": [{"name": "a", "template": "A"}, {"name": "b", "template": "B"}]})
    with pytest.raises(ValueError, match="default"):
        no_default.render(USER)
    with pytest.raises(ValueError):
        ChatTemplate.from_tokenizer_config({"chat_template": [{"name": "x"}]})
    assert ChatTemplate.from_tokenizer_config({"eos_token": "</s>"}) is None


def test_jinja_file_wins_over_tokenizer_config(tmp_path):
    _write_json(tmp_path / "tokenizer_config.json",
                {"chat_template": "from config", "eos_token": "<|im_end|>"})
    (tmp_path / "chat_template.jinja").write_text("from file {{ eos_token }}", encoding="utf-8")
    (tmp_path / "additional_chat_templates").mkdir()
    (tmp_path / "additional_chat_templates" / "tool_use.jinja").write_text("tools file")
    template = ChatTemplate.from_model_dir(tmp_path)
    assert template.render(USER) == "from file <|im_end|>"
    assert template.render(USER, tools=[SEARCH_TOOL]) == "tools file"


_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                 10: "<Q", 11: "<q", 12: "<d"}


def _gguf_metadata(path):
    """A GGUF file's key/value metadata, read directly: the header is all this test needs, and a
    full reader spends seconds mapping every tensor and merge."""
    import struct

    with open(path, "rb") as f:
        data = memoryview(f.read(16 << 20))  # the metadata (vocab, merges) sits at the start
    pos = 0

    def take(fmt):
        nonlocal pos
        (value,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return value

    def string():
        nonlocal pos
        n = take("<Q")
        pos += n
        return bytes(data[pos - n:pos]).decode("utf-8")

    def value(kind):
        if kind == 8:
            return string()
        if kind == 9:
            elem, n = take("<I"), take("<Q")
            return [value(elem) for _ in range(n)]
        return take(_GGUF_SCALARS[kind])

    assert bytes(data[:4]) == b"GGUF"
    pos = 8
    _, n_kv = take("<Q"), take("<Q")
    meta = {}
    for _ in range(n_kv):
        key = string()
        meta[key] = value(take("<I"))
    return meta


def test_demo_gguf_template(demo_gguf, hf):
    meta = _gguf_metadata(demo_gguf)
    assert meta["tokenizer.chat_template"] == TEMPLATES["qwen2.5"]  # the fixture is the real one
    template = ChatTemplate.load(demo_gguf, gguf_metadata=meta)
    assert template.origin == "GGUF metadata"
    # As the HF tokenizer: eos and pad set; no bos, though the GGUF records a bos id.
    assert template.special_tokens == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    messages, kwargs = _kwargs("tool_call_round_trip", True, None)
    assert template.render(messages, **kwargs) == hf(TEMPLATES["qwen2.5"], messages, **kwargs)
