"""What a chat request's structured parts become: the prompt, the constraint, and the reader of
the reply.

The same for the one-sequence path (generate.chat_completion) and the server: `ChatRequest`
takes OpenAI's fields (messages, tools, tool_choice, parallel_tool_calls, response_format) and
gives
- `prompt`: the messages rendered by the model's template (tool-call arguments given as JSON
  strings, as OpenAI sends them, become objects first: see toolcalls.prepare_messages);
- `constraint`: what the reply must match (response_format, or the tool-call grammar for
  tool_choice "required" / a named function), or None;
- `thinking`: where the reply starts with respect to Qwen3's <think> part (None for models
  without one), so that the constraint applies after it;
- `parser()`: a fresh ReplyParser that turns the reply text into content, reasoning_content and
  tool_calls, whole or as stream deltas.
"""
from __future__ import annotations

from ..errors import InvalidRequest
from ..text.toolcalls import ReplyParser, tool_choice_mode, tool_names
from .constraints import normalize_spec, thinking_phase, tool_call_constraint, tokenizer_info
from .generate import render_chat


class ChatRequest:
    def __init__(self, model, messages, tools=None, tool_choice=None, parallel_tool_calls=True,
                 response_format=None, template_kwargs=None):
        tok = model.tokenizer
        if tok is None:
            raise InvalidRequest(f"{model.source or 'this model'} has no tokenizer: chat needs one")
        self.mode, _ = tool_choice_mode(tool_choice, tools)
        self.tools = list(tools) if tools and self.mode != "none" else None
        self.tool_names = tool_names(self.tools) if self.tools else None
        self.prompt = render_chat(model, messages, True, self.tools, **(template_kwargs or {}))
        self.thinking = thinking_phase(self.prompt) if tok.token_to_id("</think>") is not None else None
        forced = None
        if self.mode == "required":
            forced = tool_call_constraint(self.tools, tool_choice, parallel_tool_calls, tokenizer_info(model))
        if forced is not None and normalize_spec(response_format) is not None:
            raise InvalidRequest("response_format cannot be combined with tool_choice 'required' or a "
                                 "named function: the reply is then the tool call")
        self.constraint = forced if forced is not None else response_format
        self.parallel_tool_calls = parallel_tool_calls

    def parser(self) -> ReplyParser:
        return ReplyParser(self.thinking, tools=self.tools is not None, known_names=self.tool_names)

    def finish_reason(self, generation_reason: str, parser: ReplyParser) -> str:
        """OpenAI's finish_reason: "tool_calls" when the reply called tools and ended by itself."""
        if parser.tool_calls and generation_reason == "stop":
            return "tool_calls"
        return generation_reason
