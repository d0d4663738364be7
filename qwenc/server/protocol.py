"""The OpenAI wire format: request bodies as pydantic models, and the response shapes.

Unknown fields are ignored, as OpenAI's API does; fields we cannot honour (images, audio,
`best_of` beyond `n`) are refused with a 400 naming them rather than silently ignored.
Limits on sizes (n, stop strings, messages) keep one request from taking the server.
"""
import time
import uuid
from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_N = 16                # completions per request
MAX_STOP = 16             # stop strings per request
MAX_STOP_LEN = 256        # characters per stop string
MAX_MESSAGES = 4096       # messages per chat request
MAX_LOGIT_BIAS = 1024     # entries of logit_bias


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    """Settings both endpoints share. None means: the model's generation_config default."""
    model: Optional[str] = None
    max_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = Field(None, ge=0, le=2)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    top_k: Optional[int] = Field(None, ge=-1)
    min_p: Optional[float] = Field(None, ge=0, le=1)
    seed: Optional[int] = Field(None, ge=0, lt=2 ** 63)
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = Field(None, max_length=64)
    presence_penalty: Optional[float] = Field(None, ge=-2, le=2)
    frequency_penalty: Optional[float] = Field(None, ge=-2, le=2)
    repetition_penalty: Optional[float] = Field(None, gt=0, le=10)
    logit_bias: Optional[Dict[str, float]] = None
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    ignore_eos: bool = False
    user: Optional[str] = None
    guided_json: Optional[Union[Dict[str, Any], str]] = None   # vLLM's names for constraints
    guided_regex: Optional[str] = None
    guided_grammar: Optional[str] = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings")
        for s in stops:
            if not s:
                raise ValueError("stop strings must not be empty")
            if len(s) > MAX_STOP_LEN:
                raise ValueError(f"stop strings are at most {MAX_STOP_LEN} characters")
        return stops or None

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v):
        if v is None:
            return v
        if len(v) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} logit_bias entries")
        for k, b in v.items():
            if not k.isdigit():
                raise ValueError(f"logit_bias keys must be token ids, got {k!r}")
            if not -100 <= b <= 100:
                raise ValueError("logit_bias values must be in [-100, 100]")
        return v

    def constraint(self, response_format=None):
        """The constraint spec of response_format / guided_* (at most one of them)."""
        from ..engine.constraints import constraint_spec
        guided = self.guided_json
        if isinstance(guided, str):
            import json
            try:
                guided = json.loads(guided)
            except ValueError as exc:
                raise ValueError(f"guided_json is not a JSON schema: {exc}") from None
        return constraint_spec(regex=self.guided_regex, json_schema=guided, grammar=self.guided_grammar,
                               response_format=response_format)

    def sampling(self) -> dict:
        """Keyword arguments for Engine.submit."""
        out = {}
        for name in ("temperature", "top_p", "min_p", "seed", "presence_penalty", "frequency_penalty",
                     "repetition_penalty", "logit_bias"):
            v = getattr(self, name)
            if v is not None:
                out[name] = v
        if self.top_k is not None:
            out["top_k"] = max(0, self.top_k)  # OpenAI-style -1 and 0 both mean "off"
        return out


# ---------------------------------------------------------------- chat

class ContentPart(_Body):
    type: str
    text: Optional[str] = None


class FunctionCall(_Body):
    name: str
    arguments: Union[str, Dict[str, Any]] = "{}"


class ToolCall(_Body):
    id: Optional[str] = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, List[ContentPart]]] = None
    name: Optional[str] = None
    tool_calls: Optional[List[ToolCall]] = None
    tool_call_id: Optional[str] = None
    reasoning_content: Optional[str] = None

    @model_validator(mode="after")
    def _has_content(self):
        """Only an assistant message with tool calls may come without content (as in OpenAI's
        API): the templates write the content as text, and a null one failed there."""
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            needs = "content or tool_calls" if self.role == "assistant" else "content (a string or text parts)"
            raise ValueError(f"{self.role} messages need {needs}")
        return self

    def text(self) -> Optional[str]:
        """The content as one string: text parts joined; other part types refused."""
        if self.content is None or isinstance(self.content, str):
            return self.content
        parts = []
        for p in self.content:
            if p.type != "text" or p.text is None:
                raise ValueError(f"content parts of type {p.type!r} are not supported (text only)")
            parts.append(p.text)
        return "".join(parts)


class Function(_Body):
    name: str
    description: Optional[str] = None
    parameters: Optional[Dict[str, Any]] = None
    strict: Optional[bool] = None


class Tool(_Body):
    type: Literal["function"] = "function"
    function: Function


class ChatCompletionRequest(_Sampling):
    messages: List[Message] = Field(..., min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)
    chat_template_kwargs: Optional[Dict[str, Any]] = None
    tools: Optional[List[Tool]] = None
    tool_choice: Optional[Union[str, Dict[str, Any]]] = None
    parallel_tool_calls: bool = True
    response_format: Optional[Dict[str, Any]] = None
    add_generation_prompt: bool = True

    def template_messages(self) -> list:
        """Messages as the chat template takes them (OpenAI's tool-call arguments are JSON
        strings; templates render them as given)."""
        out = []
        for m in self.messages:
            d = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            if m.name is not None:
                d["name"] = m.name
            if m.tool_calls:
                d["tool_calls"] = [{"id": c.id, "type": c.type,
                                    "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                   for c in m.tool_calls]
            if m.tool_call_id is not None:
                d["tool_call_id"] = m.tool_call_id
            if m.reasoning_content is not None:
                d["reasoning_content"] = m.reasoning_content
            out.append(d)
        return out


# ---------------------------------------------------------------- completions

class CompletionRequest(_Sampling):
    prompt: Union[str, List[str], List[int], List[List[int]]]
    response_format: Optional[Dict[str, Any]] = None
    # OpenAI's default for this endpoint; 0 with echo and logprobs scores a prompt without generating
    max_tokens: Optional[int] = Field(16, ge=0)
    echo: bool = False
    logprobs: Optional[int] = Field(None, ge=0, le=20)
    suffix: Optional[str] = None
    best_of: Optional[int] = None

    def prompts(self) -> list:
        """The prompt(s): one entry per prompt, each a string or a list of ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise ValueError("prompt must not be empty")
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)


class TokenizeRequest(_Body):
    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[List[Message]] = Field(None, max_length=MAX_MESSAGES)
    tools: Optional[List[Tool]] = None                     # rendered as a chat request renders them
    chat_template_kwargs: Optional[Dict[str, Any]] = None
    add_generation_prompt: bool = True
    add_special_tokens: bool = True


class DetokenizeRequest(_Body):
    model: Optional[str] = None
    tokens: List[int] = Field(..., max_length=1_000_000)


# ---------------------------------------------------------------- responses

def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def error_body(message: str, type_: str = "invalid_request_error", param: str = None, code: str = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
