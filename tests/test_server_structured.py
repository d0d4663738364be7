"""Structured output and tools over HTTP, with the official openai client: response_format (json
mode, json_schema, client.chat.completions.parse with a pydantic class), vLLM's guided_json /
guided_regex / guided_grammar on both endpoints, tool_choice required / named / none, streamed
tool calls, and a full tool round trip on the real demo model.

On the random-weight model the text is nonsense, which is the point: whatever the model would
say, the constrained output must parse and validate (jsonschema is the oracle)."""
import json
import re

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

import qwenc
from serverutil import LiveServer


@pytest.fixture(scope="module")
def model(text_model_dir):
    return qwenc.load(text_model_dir, context=1024)


@pytest.fixture(scope="module")
def live(model):
    srv = LiveServer(model, kv_memory="64MiB")
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def client(live):
    return live.client()


ASK = [{"role": "user", "content": "Describe a person."}]

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 150}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]},
                                               "minItems": 1, "maxItems": 3}},
     "required": ["tags"], "additionalProperties": False},
    {"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                      "required": ["x", "y"], "additionalProperties": False}},
     "type": "object", "properties": {"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"},
                                      "label": {"type": "string", "maxLength": 8}},
     "required": ["a", "b"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "level": {"enum": ["low", "mid", "high"]},
                                      "note": {"type": ["string", "null"], "maxLength": 10}},
     "required": ["ok", "level", "note"], "additionalProperties": False},
]


@pytest.mark.parametrize("schema_i", range(len(SCHEMAS)))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_json_schema_output_validates(client, live, schema_i, seed):
    schema = SCHEMAS[schema_i]
    r = client.chat.completions.create(
        model=live.model_name, messages=ASK, max_tokens=200, temperature=1.0, seed=seed,
        response_format={"type": "json_schema", "json_schema": {"name": "thing", "schema": schema, "strict": True}})
    c = r.choices[0]
    assert c.finish_reason == "stop", c  # the grammar completed before max_tokens
    jsonschema.validate(json.loads(c.message.content), schema)


class Person(BaseModel):
    # bounded strings: a random-weight model would otherwise ramble inside one until max_tokens
    name: str = Field(max_length=16)
    age: int = Field(ge=0, le=130)
    email: str = Field(max_length=24, pattern=r"^[a-z]{1,8}@[a-z]{1,8}\.(com|org)$")


@pytest.mark.parametrize("seed", [7, 8])
def test_parse_with_a_pydantic_class(client, live, seed):
    r = client.chat.completions.parse(model=live.model_name, messages=ASK, response_format=Person,
                                      max_tokens=200, temperature=0.8, seed=seed)
    person = r.choices[0].message.parsed
    assert isinstance(person, Person) and re.fullmatch(r"[a-z]{1,8}@[a-z]{1,8}\.(com|org)", person.email)


def test_real_model_json_object_mode(demo_gguf):
    model = qwenc.load(demo_gguf, context=1024)
    srv = LiveServer(model, max_batch=2, kv_memory="64MiB")
    try:
        r = srv.client().chat.completions.create(
            model=srv.model_name, max_tokens=120, temperature=0, response_format={"type": "json_object"},
            messages=[{"role": "user", "content": "Give the name and capital of France as JSON."}])
        assert r.choices[0].finish_reason == "stop"
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    finally:
        srv.close()


def test_guided_fields_on_both_endpoints(client, live):
    r = client.completions.create(model=live.model_name, prompt="Phone: ", max_tokens=30, temperature=1.0, seed=1,
                                  extra_body={"guided_regex": r"\(\d{3}\) \d{3}-\d{4}"})
    assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", r.choices[0].text)
    r = client.completions.create(model=live.model_name, prompt="Data: ", max_tokens=120, temperature=1.0, seed=2,
                                  extra_body={"guided_json": SCHEMAS[0]})
    jsonschema.validate(json.loads(r.choices[0].text), SCHEMAS[0])
    grammar = 'start: "yes" | "no" | "maybe " NUM\nNUM: /[0-9]{1,3}/'
    r = client.chat.completions.create(model=live.model_name, messages=ASK, max_tokens=10, temperature=1.0, seed=4,
                                       extra_body={"guided_grammar": grammar})
    assert re.fullmatch(r"yes|no|maybe [0-9]{1,3}", r.choices[0].message.content)
    streamed = client.chat.completions.create(model=live.model_name, messages=ASK, max_tokens=120, temperature=1.0,
                                              seed=5, stream=True, extra_body={"guided_json": SCHEMAS[1]})
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    jsonschema.validate(json.loads(text), SCHEMAS[1])


def test_bad_constraints_are_400(live):
    url = live.url + "/v1/chat/completions"
    for bad in ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wat"}}}},
                {"guided_regex": "(unclosed"},
                {"guided_grammar": "start: ???"},
                {"guided_json": "{not json"},
                {"guided_regex": "a+", "guided_json": {"type": "object"}},
                {"response_format": {"type": "yaml"}}):
        r = httpx.post(url, json={"messages": ASK, "max_tokens": 5, **bad}, timeout=60)
        assert r.status_code == 400, (bad, r.text)
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}},
                   "required": ["zone"], "additionalProperties": False}}}


@pytest.mark.parametrize("seed", [0, 1])
def test_tool_choice_required_forces_valid_calls(client, live, seed):
    r = client.chat.completions.create(model=live.model_name, messages=[{"role": "user", "content": "Weather?"}],
                                       tools=[WEATHER, TIME], tool_choice="required", max_tokens=200,
                                       temperature=1.0, seed=seed)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.tool_calls
    for call in c.message.tool_calls:
        assert call.type == "function" and call.id
        schema = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]["function"]["parameters"]
        jsonschema.validate(json.loads(call.function.arguments), schema)
    assert "<tool_call>" not in (c.message.content or "")


def test_named_tool_choice_and_streamed_tool_calls(client, live):
    choice = {"type": "function", "function": {"name": "get_time"}}
    whole = client.chat.completions.create(model=live.model_name, messages=[{"role": "user", "content": "Time?"}],
                                           tools=[WEATHER, TIME], tool_choice=choice, max_tokens=120,
                                           temperature=0.7, seed=11, parallel_tool_calls=False)
    call = whole.choices[0].message.tool_calls[0]
    assert call.function.name == "get_time" and len(whole.choices[0].message.tool_calls) == 1
    jsonschema.validate(json.loads(call.function.arguments), TIME["function"]["parameters"])
    chunks = list(client.chat.completions.create(
        model=live.model_name, messages=[{"role": "user", "content": "Time?"}], tools=[WEATHER, TIME],
        tool_choice=choice, max_tokens=120, temperature=0.7, seed=11, parallel_tool_calls=False, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "<tool_call>" not in content and "</tool_call>" not in content
    deltas = [tc for c in chunks if c.choices and c.choices[0].delta.tool_calls for tc in c.choices[0].delta.tool_calls]
    assert deltas[0].id and deltas[0].function.name == "get_time"
    args = "".join(d.function.arguments or "" for d in deltas if d.function)
    assert args == call.function.arguments
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_tool_choice_none_never_calls(client, live):
    r = client.chat.completions.create(model=live.model_name, messages=[{"role": "user", "content": "Weather?"}],
                                       tools=[WEATHER], tool_choice="none", max_tokens=20, temperature=0)
    assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason != "tool_calls"


@pytest.fixture(scope="module")
def demo_live(demo_gguf):
    srv = LiveServer(qwenc.load(demo_gguf, context=2048), max_batch=2, kv_memory="128MiB")
    yield srv
    srv.close()


def test_real_model_tool_round_trip(demo_live):
    """The model calls a function, the test returns its result, the model answers with it."""
    client = demo_live.client()
    msgs = [{"role": "user", "content": "What is the weather in Paris right now? Use the tool."}]
    first = client.chat.completions.create(model=demo_live.model_name, messages=msgs, tools=[WEATHER],
                                           tool_choice="required", parallel_tool_calls=False,
                                           max_tokens=100, temperature=0)
    c = first.choices[0]
    assert c.finish_reason == "tool_calls"
    call = c.message.tool_calls[0]
    args = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and "paris" in args["city"].lower()
    msgs.append({"role": "assistant", "content": c.message.content,
                 "tool_calls": [{"id": call.id, "type": "function",
                                 "function": {"name": call.function.name, "arguments": call.function.arguments}}]})
    msgs.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp": 17, "unit": args["unit"],
                                                                                 "sky": "light rain"})})
    answer = client.chat.completions.create(model=demo_live.model_name, messages=msgs, tools=[WEATHER],
                                            max_tokens=80, temperature=0)
    text = answer.choices[0].message.content
    assert answer.choices[0].finish_reason == "stop" and "17" in text, text


def test_real_model_untagged_calls_are_calls(demo_live):
    """With tool_choice auto the demo model (Qwen2.5-Coder) writes its call as a bare JSON object,
    without the <tool_call> tags: it must still arrive as tool_calls, whole and streamed, and a
    question the tool does not fit must still get text."""
    client = demo_live.client()
    for city in ("Paris", "Tokyo"):
        msgs = [{"role": "user", "content": f"What's the weather like in {city} right now?"}]
        r = client.chat.completions.create(model=demo_live.model_name, messages=msgs, tools=[WEATHER],
                                           max_tokens=60, temperature=0)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and not c.message.content, c
        (call,) = c.message.tool_calls
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, WEATHER["function"]["parameters"])
        assert call.function.name == "get_weather" and city.lower() in args["city"].lower()
        chunks = list(client.chat.completions.create(model=demo_live.model_name, messages=msgs, tools=[WEATHER],
                                                     max_tokens=60, temperature=0, stream=True))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        streamed = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or ())]
        assert not text and streamed[0].function.name == "get_weather"
        assert "".join(tc.function.arguments or "" for tc in streamed) == call.function.arguments
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"
    r = client.chat.completions.create(model=demo_live.model_name, tools=[WEATHER], max_tokens=30, temperature=0,
                                       messages=[{"role": "user", "content": "Write a haiku about the sea."}])
    assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.content
    assert not r.choices[0].message.tool_calls
