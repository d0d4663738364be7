"""Constrained decoding, tool calls and the reply readers on the real demo model
(Qwen2.5-Coder-0.5B-Instruct Q4_K_M): the outputs must parse and validate, greedy and sampled."""
import json
import re

import jsonschema
import pytest
from pydantic import BaseModel, Field

import qwenc


class City(BaseModel):
    name: str = Field(max_length=40)
    country: str = Field(max_length=40)
    population: int = Field(ge=0, le=100_000_000)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def model(demo_gguf):
    return qwenc.load(demo_gguf, context=1024)


def test_chat_response_format_pydantic(model):
    messages = [{"role": "user", "content": "Give me facts about Paris as JSON."}]
    for sampling in (dict(temperature=0), dict(temperature=1.0, seed=1)):
        out = model.chat(messages, response_format=City, max_tokens=80, **sampling)
        choice = out["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        city = City.model_validate_json(choice["message"]["content"])
        assert city.name
    brief = [{"role": "user", "content": "Reply with a JSON object with the keys name and country of the "
                                         "capital of France, nothing else."}]
    out = model.chat(brief, response_format={"type": "json_object"}, max_tokens=60, temperature=0)
    assert out["choices"][0]["finish_reason"] == "stop", out
    assert isinstance(json.loads(out["choices"][0]["message"]["content"]), dict)


def test_generate_regex(model):
    prompt = "The first moon landing happened on (YYYY-MM-DD): "
    text = model.generate(prompt, regex=r"\d{4}-\d{2}-\d{2}", max_tokens=20, temperature=0)
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", text)
    assert text == "1969-07-20" or text.startswith("19")  # the model knows roughly when


def test_tool_choice_required_and_round_trip(model):
    messages = [{"role": "user", "content": "What's the weather like in Paris right now?"}]
    # with parallel calls allowed (OpenAI's default) too: the model ends after its call (the
    # grammar lets it end after the newline it writes there) instead of calling again and again
    for parallel in (False, True):
        out = model.chat(messages, tools=[WEATHER], tool_choice="required", parallel_tool_calls=parallel,
                         max_tokens=120, temperature=0)
        choice = out["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and out["usage"]["completion_tokens"] < 60, out
        (call,) = choice["message"]["tool_calls"]
        args = json.loads(call["function"]["arguments"])
        jsonschema.validate(args, WEATHER["function"]["parameters"])
        assert call["function"]["name"] == "get_weather" and "paris" in args["city"].lower()
    # the result goes back as OpenAI sends it; the model answers in text
    messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"temp_c": 21, "sky": "sunny"})}]
    out = model.chat(messages, tools=[WEATHER], max_tokens=40, temperature=0)
    answer = out["choices"][0]["message"]
    assert "tool_calls" not in answer and answer["content"] and "<tool_call>" not in answer["content"]
    assert "21" in answer["content"] or "sunny" in answer["content"].lower()
