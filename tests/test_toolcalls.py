"""Reading Qwen's replies: tool calls (<tool_call>{...}</tool_call>) and Qwen3's <think> part.

Hand-written replies with the expected OpenAI fields written out; then the streaming readers fed
the same replies split at every position (and in random pieces) must add up to the same result.
Last, OpenAI-format history (arguments as JSON strings, role "tool" results) must render as
transformers renders the same conversation with the real templates.
"""
import copy
import itertools
import json
import random

import pytest

from qwenc.text.reasoning import ReasoningStream, split_reasoning
from qwenc.text.toolcalls import (ReplyParser, ToolCallStream, parse_reply, parse_tool_calls, prepare_messages,
                                  tool_choice_mode)
from qwenc.errors import InvalidRequest


def ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def call(name, args, i):
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


BLOCK = '<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


def block(name, args):
    return BLOCK.format(name=name, args=json.dumps(args, ensure_ascii=False))


W = {"city": "Paris"}
NESTED = {"query": {"must": [{"term": {"a": "{x}"}}, {"range": {"n": [1, 2, {"lt": 3}]}}]}, "note": "braces } { ] ["}
TRICKY = {"text": "write </tool_call> and <tool_call> literally", "quote": "he said \"hi\\\" there\"",
          "path": "C:\\temp\\", "emoji": "東京 🙂"}

# (reply, expected content, expected calls)
CASES = {
    "plain text": ("Hello! How can I help?", "Hello! How can I help?", []),
    "empty": ("", "", []),
    "one call": (block("get_weather", W), None, [call("get_weather", W, 0)]),
    "text before": ("Let me check the weather.\n" + block("get_weather", W), "Let me check the weather.",
                    [call("get_weather", W, 0)]),
    "two calls": (block("get_weather", W) + "\n" + block("get_weather", {"city": "東京", "unit": "c"}), None,
                  [call("get_weather", W, 0), call("get_weather", {"city": "東京", "unit": "c"}, 1)]),
    "text around": ("First:\n\n" + block("a", {}) + "\nthen\n" + block("b", {"x": 1}) + "\n\nDone.  ",
                    "First:\n\n\nthen\n\n\nDone.  ", [call("a", {}, 0), call("b", {"x": 1}, 1)]),
    "leading space kept without calls": ("  hi  ", "  hi  ", []),
    "space around a call at the ends": ("  " + block("a", {}) + "  ", None, [call("a", {}, 0)]),
    "nested braces": (block("search", NESTED), None, [call("search", NESTED, 0)]),
    "markup inside strings": (block("echo", TRICKY), None, [call("echo", TRICKY, 0)]),
    "no arguments key": ('<tool_call>\n{"name": "now"}\n</tool_call>', None, [call("now", {}, 0)]),
    "arguments as a string": ('<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1}"}\n</tool_call>', None,
                              [call("f", {"a": 1}, 0)]),
    "unterminated last block": ("ok " + '<tool_call>\n{"name": "f", "arguments": {"a": [1]}}\n', "ok",
                                [call("f", {"a": [1]}, 0)]),
    "compact": ('<tool_call>{"name":"f","arguments":{"a":1}}</tool_call>', None, [call("f", {"a": 1}, 0)]),
    # malformed: text, markup and all
    "bad json": ('x <tool_call>\n{"name": "f", "arguments": {"a": 1,}}\n</tool_call>',
                 'x <tool_call>\n{"name": "f", "arguments": {"a": 1,}}\n</tool_call>', []),
    "missing brace": ('<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>\nafter',
                      '<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>\nafter', []),
    "not an object": ('<tool_call>\n["f", 1]\n</tool_call>', '<tool_call>\n["f", 1]\n</tool_call>', []),
    "name not a string": ('<tool_call>\n{"name": 3, "arguments": {}}\n</tool_call>',
                          '<tool_call>\n{"name": 3, "arguments": {}}\n</tool_call>', []),
    "arguments a list": ('<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>',
                         '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>', []),
    "junk after object": ('<tool_call>\n{"name": "f", "arguments": {}} extra\n</tool_call>',
                          '<tool_call>\n{"name": "f", "arguments": {}} extra\n</tool_call>', []),
    "cut off in the object": ('Sure <tool_call>\n{"name": "f", "argu', 'Sure <tool_call>\n{"name": "f", "argu', []),
    "cut off string with markup": ('<tool_call>\n{"name": "f", "arguments": {"t": "</tool_call> x',
                                   '<tool_call>\n{"name": "f", "arguments": {"t": "</tool_call> x', []),
    "good then bad": (block("f", {"a": 1}) + "\n<tool_call>\nnope\n</tool_call>",
                      "<tool_call>\nnope\n</tool_call>", [call("f", {"a": 1}, 0)]),
    "bad then good": ("<tool_call>oops</tool_call>\n" + block("f", {"a": 1}),
                      "<tool_call>oops</tool_call>", [call("f", {"a": 1}, 0)]),
    "lone tags as text": ("a </tool_call> b < c <tool", "a </tool_call> b < c <tool", []),
    "only the tag": ("<tool_call>", "<tool_call>", []),
}


@pytest.mark.parametrize("name", CASES)
def test_one_shot(name):
    text, content, calls = CASES[name]
    got_content, got_calls = parse_tool_calls(text, id_factory=ids())
    assert got_content == content
    assert got_calls == calls
    for c in got_calls:
        json.loads(c["function"]["arguments"])


def test_unknown_function_stays_text():
    text = block("rm_rf", {"path": "/"})
    assert parse_tool_calls(text, known_names={"get_weather"}) == (text, [])
    content, calls = parse_tool_calls(text, known_names={"rm_rf"})
    assert content is None and len(calls) == 1


def test_ids_are_random_and_openai_shaped():
    _, a = parse_tool_calls(block("f", {}) + block("f", {}))
    assert len({c["id"] for c in a}) == 2 and all(c["id"].startswith("call_") and len(c["id"]) > 10 for c in a)


def assemble(deltas):
    """What an OpenAI client accumulates from deltas: content, and calls by index."""
    content, calls = [], {}
    for d in deltas:
        assert set(d) <= {"content", "tool_calls"}, d
        if "content" in d:
            assert isinstance(d["content"], str) and d["content"]
            content.append(d["content"])
        for tc in d.get("tool_calls", ()):
            if tc["index"] not in calls:
                # the first delta of a call carries id, type and name
                assert set(tc) == {"index", "id", "type", "function"} and tc["type"] == "function"
                calls[tc["index"]] = {"id": tc["id"], "type": "function",
                                      "function": {"name": tc["function"]["name"], "arguments": ""}}
            else:
                assert "id" not in tc and "name" not in tc["function"]
            calls[tc["index"]]["function"]["arguments"] += tc["function"].get("arguments", "")
    assert sorted(calls) == list(range(len(calls)))
    return "".join(content), [calls[i] for i in sorted(calls)]


def stream(pieces, **kw):
    s = ToolCallStream(id_factory=ids(), **kw)
    deltas = []
    for p in pieces:
        deltas += s.push(p)
    deltas += s.finish()
    return deltas


def no_markup_leak(deltas, text):
    """Content deltas never carry a call's markup (malformed blocks, which are text, excepted)."""
    expected_content, calls = parse_tool_calls(text)
    if "<tool" not in (expected_content or ""):
        for d in deltas:
            assert "<tool" not in d.get("content", "") and "</tool" not in d.get("content", "")


@pytest.mark.parametrize("name", CASES)
def test_stream_split_at_every_position(name):
    text, content, calls = CASES[name]
    for cut in range(len(text) + 1):
        deltas = stream([text[:cut], text[cut:]])
        got_content, got_calls = assemble(deltas)
        assert (got_content or None) == (content or None) and got_calls == calls, cut
        no_markup_leak(deltas, text)
    # and two cuts, at every pair of positions for the short ones
    if len(text) <= 90:
        for i in range(len(text) + 1):
            for j in range(i, len(text) + 1):
                got = assemble(stream([text[:i], text[i:j], text[j:]]))
                assert ((got[0] or None), got[1]) == ((content or None), calls), (i, j)


@pytest.mark.parametrize("seed", range(20))
def test_stream_in_random_pieces(seed):
    rng = random.Random(seed)
    names = list(CASES)
    # a long reply made of several cases, cut into random pieces (one character up to 12)
    picked = [CASES[rng.choice(names)][0] for _ in range(4)]
    text = "\n".join(picked)
    pieces, i = [], 0
    while i < len(text):
        n = rng.randint(1, 12)
        pieces.append(text[i:i + n])
        i += n
    content, calls = parse_tool_calls(text, id_factory=ids())
    got_content, got_calls = assemble(stream(pieces))
    assert (got_content or None) == (content or None) and got_calls == calls


def test_stream_char_by_char_releases_early():
    """Content is released as soon as it cannot be markup, and a call as soon as its block closes."""
    s = ToolCallStream(id_factory=ids())
    text = "Hello there <tool_call>\n" + '{"name": "f", "arguments": {"a": 1}}' + "\n</tool_call>\nbye"
    seen = []
    for ch in text:
        seen.append(s.push(ch))
    released = "".join(d.get("content", "") for ds in seen for d in ds)
    upto = text.index("<tool_call>") + 5  # "Hello there <tool" pushed: the words are out, the space held
    assert "".join(d.get("content", "") for ds in seen[:upto] for d in ds) == "Hello there"
    first_call = next(i for i, ds in enumerate(seen) if any("tool_calls" in d for d in ds))
    assert first_call == len(text) - len("\nbye") - 1  # the ">" closing </tool_call>
    assert released == "Hello there \nbye"  # the whitespace around the call joins the two texts
    assert s.finish() == []


def test_a_wrong_reader_fails_the_split_test():
    """Falsifier: a reader that searches for </tool_call> without reading the JSON gets the
    markup-inside-strings case wrong, and the one-shot expectation catches it."""
    text = CASES["markup inside strings"][0]
    naive = text[len("<tool_call>"):text.index("</tool_call>")]
    with pytest.raises(ValueError):
        json.loads(naive)


# ---------------------------------------------------------------- untagged (bare) calls

KNOWN = {"get_weather", "f"}
BARE = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
# (reply, expected content, expected calls), read with the functions KNOWN
BARE_CASES = {
    "bare object": (BARE, None, [call("get_weather", W, 0)]),
    "spaces and newlines around": ("\n  " + BARE + "\n", None, [call("get_weather", W, 0)]),
    "json fence": ("```json\n" + BARE + "\n```", None, [call("get_weather", W, 0)]),
    "plain fence, text after it is none": ("```\n" + BARE + "\n```\n", None, [call("get_weather", W, 0)]),
    "fence left open": ("```json\n" + BARE + "\n", None, [call("get_weather", W, 0)]),
    "a list of calls": ('[{"name": "f", "arguments": {}}, ' + BARE + "]", None,
                        [call("f", {}, 0), call("get_weather", W, 1)]),
    "one object per line": ('{"name": "f", "arguments": {"a": 1}}\n' + BARE, None,
                            [call("f", {"a": 1}, 0), call("get_weather", W, 1)]),
    "markup inside strings": ('{"name": "f", "arguments": ' + json.dumps(TRICKY) + "}", None,
                              [call("f", TRICKY, 0)]),
    "unknown name": ('{"name": "rm", "arguments": {}}', '{"name": "rm", "arguments": {}}', []),
    "not a call": ('{"city": "Paris"}', '{"city": "Paris"}', []),
    "a description, not a call": ('{"name": "f", "description": "does f"}', '{"name": "f", "description": "does f"}', []),
    "a call with more keys": ('{"name": "f", "arguments": {}, "id": 1}', '{"name": "f", "arguments": {}, "id": 1}', []),
    "no arguments key": ('{"name": "f"}', '{"name": "f"}', []),
    "parameters for arguments": ('{"name": "f", "parameters": {"a": 1}}', None, [call("f", {"a": 1}, 0)]),
    "text after": (BARE + " is what I would call.", BARE + " is what I would call.", []),
    "text before": ("Call: " + BARE, "Call: " + BARE, []),
    "one good one bad": (BARE + '\n{"name": "nope"}', BARE + '\n{"name": "nope"}', []),
    "empty list": ("[]", "[]", []),
    "other fence": ("```python\nprint(1)\n```", "```python\nprint(1)\n```", []),
    "cut off": ('{"name": "f", "argu', '{"name": "f", "argu', []),
    "a tagged call still reads": ("  " + block("f", {}), None, [call("f", {}, 0)]),
    "lone backticks": ("`x` and ``", "`x` and ``", []),
}


@pytest.mark.parametrize("name", BARE_CASES)
def test_bare_calls(name):
    text, content, calls = BARE_CASES[name]
    assert parse_tool_calls(text, known_names=KNOWN, id_factory=ids()) == (content, calls)
    for cut in range(len(text) + 1):
        got = assemble(stream([text[:cut], text[cut:]], known_names=KNOWN))
        assert ((got[0] or None), got[1]) == ((content or None), calls), cut
    if len(text) <= 70:
        for i in range(len(text) + 1):
            for j in range(i, len(text) + 1):
                got = assemble(stream([text[:i], text[i:j], text[j:]], known_names=KNOWN))
                assert ((got[0] or None), got[1]) == ((content or None), calls), (i, j)


def test_bare_calls_need_declared_functions():
    """Without the request's functions, a bare object is only text (any JSON answer would do)."""
    assert parse_tool_calls(BARE) == (BARE, [])
    assert parse_tool_calls(BARE, known_names=set()) == (BARE, [])


def test_a_reply_that_cannot_be_bare_calls_streams_at_once():
    """Only a reply that may still be bare calls is held: text is released as it comes, and a
    JSON answer as soon as its first object is not a call."""
    s = ToolCallStream(known_names=KNOWN, id_factory=ids())
    assert s.push("Sunny") == [{"content": "Sunny"}]
    s = ToolCallStream(known_names=KNOWN, id_factory=ids())
    assert s.push('{"temp": ') == []
    assert s.push('21} and') == [{"content": '{"temp": 21} and'}]
    s = ToolCallStream(known_names=KNOWN, id_factory=ids())
    assert s.push(BARE) == [] and s.push("\n") == []
    deltas = s.finish()
    assert assemble(deltas) == ("", [call("get_weather", W, 0)])


# ---------------------------------------------------------------- reasoning

REASONING = {
    "plain": ("maybe", "Just an answer.", None, "Just an answer."),
    "think": ("maybe", "<think>\nLet me see: 2+2.\n</think>\n\n4", "Let me see: 2+2.", "4"),
    "empty think": ("maybe", "<think>\n\n</think>\n\nHi", "", "Hi"),
    "newlines inside": ("maybe", "<think>\na\n\nb\n</think>\n\nc\n\nd\n", "a\n\nb", "c\n\nd\n"),
    "cut off thinking": ("maybe", "<think>\nstill going\n\n", "still going", ""),
    "cut off in the end tag": ("maybe", "<think>\nx\n</thi", "x\n</thi", ""),
    "think not at start": ("maybe", "A <think>b</think>", None, "A <think>b</think>"),
    "partial start tag only": ("maybe", "<thi", None, "<thi"),
    "prompt opened it": ("thinking", "ok so\n</think>\n\nanswer", "ok so", "answer"),
    "no thinking phase": ("answer", "<think>x</think>y", None, "<think>x</think>y"),
    "tag text in answer": ("maybe", "<think>r</think>\n\nuse </think> and <think>", "r", "use </think> and <think>"),
}


@pytest.mark.parametrize("name", REASONING)
def test_reasoning_split(name):
    phase, text, reasoning, content = REASONING[name]
    assert split_reasoning(text, phase) == (reasoning, content)
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            s = ReasoningStream(phase)
            deltas = s.push(text[:i]) + s.push(text[i:j]) + s.push(text[j:]) + s.finish()
            got_r = "".join(d.get("reasoning_content", "") for d in deltas)
            got_c = "".join(d.get("content", "") for d in deltas)
            assert (got_r, got_c) == (reasoning or "", content), (i, j)
            assert s.reasoning == reasoning and s.content == content
            for d in deltas:
                assert "<think>" not in d.get("reasoning_content", "")


def test_reasoning_matches_what_the_qwen3_template_recovers():
    """The split equals what Qwen3's template takes from a reply when it renders it back."""
    text = "<think>\nFirst, 7 × 13.\n\n</think>\n\n91 is not prime."
    reasoning, content = split_reasoning(text)
    # the template's own expressions, in Python
    t_reasoning = text.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
    t_content = text.split("</think>")[-1].lstrip("\n")
    assert (reasoning, content) == (t_reasoning, t_content)


def test_reply_parser_chains_thinking_and_tools():
    text = ("<think>\nThe user wants weather; a <tool_call> here is only thought.\n</think>\n\n"
            "Checking.\n" + block("get_weather", W))
    msg = parse_reply(text, phase="maybe", tools=True, id_factory=ids())
    assert msg == {"role": "assistant", "content": "Checking.",
                   "reasoning_content": "The user wants weather; a <tool_call> here is only thought.",
                   "tool_calls": [call("get_weather", W, 0)]}
    for cut in range(len(text) + 1):
        p = ReplyParser("maybe", tools=True, id_factory=ids())
        deltas = p.push(text[:cut]) + p.push(text[cut:]) + p.finish()
        r = "".join(d.get("reasoning_content", "") for d in deltas)
        rest = [d for d in deltas if "reasoning_content" not in d]
        assert r == msg["reasoning_content"] and assemble(rest) == ("Checking.", msg["tool_calls"])
        assert p.message() == msg
    # tools off: the call is content
    assert parse_reply(block("f", {}), tools=False)["content"] == block("f", {})


def test_tool_choice_modes():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert tool_choice_mode(None, tools) == ("auto", None)
    assert tool_choice_mode(None, None) == ("none", None)
    assert tool_choice_mode("required", tools) == ("required", None)
    assert tool_choice_mode({"type": "function", "function": {"name": "f"}}, tools) == ("required", "f")
    for bad in ({"type": "function", "function": {"name": "g"}}, "sometimes", 3):
        with pytest.raises(InvalidRequest):
            tool_choice_mode(bad, tools)
    with pytest.raises(InvalidRequest, match="needs tools"):
        tool_choice_mode("required", [])
    with pytest.raises(InvalidRequest, match="each tool"):
        tool_choice_mode("auto", [{"type": "retrieval"}])


# ---------------------------------------------------------------- history rendering

from test_chat_template import TEMPLATES, WEATHER_TOOL, _make_hf_tokenizer  # noqa: E402


def openai_history():
    """A tool round trip as an OpenAI client sends it: arguments as JSON strings, tool results
    with tool_call_id, content null on the calling turn."""
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Weather in Paris and 東京?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_2", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"東京","unit":"celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 18}'},
        {"role": "tool", "tool_call_id": "call_2", "content": '{"temp": 24}'},
        {"role": "assistant", "content": "Paris 18 °C, 東京 24 °C."},
        {"role": "user", "content": "Thanks!"},
    ]


def as_objects(messages):
    out = copy.deepcopy(messages)
    for m in out:
        for c in m.get("tool_calls") or ():
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    return out


@pytest.mark.parametrize("template", ["qwen2.5", "qwen3"])
def test_openai_history_renders_as_transformers_renders_it(template):
    from qwenc.text.chat_template import render_chat_template
    hf = _make_hf_tokenizer()
    hf.chat_template = TEMPLATES[template]
    messages = openai_history()
    before = copy.deepcopy(messages)
    ours = render_chat_template(TEMPLATES[template], prepare_messages(messages), add_generation_prompt=True,
                                tools=[WEATHER_TOOL])
    theirs = hf.apply_chat_template(as_objects(messages), tokenize=False, add_generation_prompt=True,
                                    tools=[WEATHER_TOOL])
    assert ours == theirs
    assert messages == before
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "東京", "unit": "celsius"}}\n</tool_call>' in ours
    assert "<tool_response>\n{\"temp\": 24}\n</tool_response>" in ours
    # without the preparation Qwen2.5's template quotes the JSON string a second time
    raw = render_chat_template(TEMPLATES[template], messages, add_generation_prompt=True, tools=[WEATHER_TOOL])
    if template == "qwen2.5":
        assert raw != theirs and '"arguments": "{\\"city\\": \\"Paris\\"}"' in raw


def test_prepare_messages_leaves_unparsable_arguments():
    msgs = [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "not json"}}]}]
    assert prepare_messages(msgs) == msgs
