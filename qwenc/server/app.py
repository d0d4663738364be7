"""The OpenAI-compatible HTTP API over an Engine (FastAPI on uvicorn).

Each request is read under a size limit, parsed as JSON, validated (protocol.py), turned into
one engine request per choice, and answered as one JSON body or as server-sent events ending in
`data: [DONE]`. Every failure is an OpenAI-shaped error body with the matching status; nothing
the client sends can make the server answer with a stack trace or stop serving others.
"""
import asyncio
import hmac
import json
import logging
import re

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..errors import (ChatTemplateError, ContextLengthExceeded, EngineStopped, InvalidRequest, QueueFull,
                      QwencError)
from ..engine.chat_request import ChatRequest
from ..engine.generate import chat_logprobs, finite_logprob, render_chat
from . import protocol as P
from .metrics import Metrics

log = logging.getLogger("qwenc.server")

MAX_BODY_BYTES = 8 << 20


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str = None,
                 code: str = None, headers: dict = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        return JSONResponse(P.error_body(self.message, self.type, self.param, self.code), self.status,
                            headers=self.headers)


def _engine_error(exc: Exception) -> APIError:
    """What an exception from the engine or the text layer means to the client."""
    if isinstance(exc, ContextLengthExceeded):
        return APIError(400, str(exc), param="messages", code="context_length_exceeded")
    if isinstance(exc, QueueFull):
        return APIError(503, f"the server is busy: {exc}", "server_error", code="overloaded",
                        headers={"Retry-After": "1"})
    if isinstance(exc, EngineStopped):
        return APIError(503, str(exc), "server_error", code="unavailable", headers={"Retry-After": "5"})
    if isinstance(exc, ChatTemplateError):
        return APIError(400, f"the chat template refused the messages: {exc}", param="messages")
    if isinstance(exc, (InvalidRequest, QwencError)):
        return APIError(400, str(exc))
    log.exception("internal error", exc_info=exc)
    return APIError(500, "internal server error", "server_error")


def _sanitize(obj, depth=0):
    """Lone surrogates (valid JSON escapes, not valid text) become U+FFFD, so every string the
    server passes on can be encoded; nesting is bounded (JSON itself allows any depth)."""
    if depth > MAX_DEPTH:
        raise APIError(400, f"request JSON nests deeper than {MAX_DEPTH} levels")
    if isinstance(obj, str):
        return obj.encode("utf-8", "surrogatepass").decode("utf-8", "replace") if _has_surrogate(obj) else obj
    if isinstance(obj, list):
        return [_sanitize(x, depth + 1) for x in obj]
    if isinstance(obj, dict):
        return {_sanitize(k, depth + 1): _sanitize(v, depth + 1) for k, v in obj.items()}
    return obj


def _has_surrogate(s: str) -> bool:
    try:
        s.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


MAX_DEPTH = 64
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


def _nesting(raw: bytes) -> int:
    """How deeply the arrays and objects of a JSON text nest (strings skipped), computed before
    parsing: a parser recursing through 100,000 brackets is itself the attack."""
    shape = np.frombuffer(_STRING.sub(b'""', raw), np.uint8)
    step = (np.isin(shape, (ord("["), ord("{")))).astype(np.int32) - np.isin(shape, (ord("]"), ord("}")))
    return int(np.cumsum(step).max()) if len(step) else 0


def _finite(obj):
    # json.loads accepts NaN and Infinity, which are not JSON; refuse them like OpenAI does
    raise APIError(400, f"{obj} is not a valid JSON number")


class Server:
    """The routes' state: the engine, names, limits, metrics."""

    def __init__(self, engine, model_name: str, api_key: str = None, max_body_bytes: int = MAX_BODY_BYTES):
        self.engine = engine
        self.model = engine.model
        self.tok = engine.model.tokenizer_or_raise()
        self.model_name = model_name
        self.api_key = api_key.encode() if api_key else None
        self.max_body_bytes = max_body_bytes
        self.metrics = Metrics(engine)
        self.fingerprint = f"qwenc-{__version__}-{engine.model.activations}"
        self._token_text = {}

    # -- reading requests --------------------------------------------------------------------

    def authorize(self, request: Request):
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        ok = scheme.lower() == "bearer" and hmac.compare_digest(key.strip().encode(), self.api_key)
        if not ok:
            raise APIError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')",
                           "authentication_error", code="invalid_api_key")

    async def body(self, request: Request, model_cls):
        length = request.headers.get("content-length")
        if length is not None:
            try:
                if int(length) > self.max_body_bytes:
                    raise APIError(413, f"request body over {self.max_body_bytes} bytes", code="request_too_large")
            except ValueError:
                raise APIError(400, "bad Content-Length") from None
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise APIError(413, f"request body over {self.max_body_bytes} bytes", code="request_too_large")
            chunks.append(chunk)
        raw = b"".join(chunks)
        if _nesting(raw) > MAX_DEPTH:
            raise APIError(400, f"request JSON nests deeper than {MAX_DEPTH} levels")
        try:
            data = json.loads(raw, parse_constant=_finite)
        except APIError:
            raise
        except RecursionError:
            raise APIError(400, "request JSON is nested too deeply") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise APIError(400, f"request body is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise APIError(400, "request body must be a JSON object")
        data = _sanitize(data)
        try:
            req = model_cls.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            param = ".".join(str(x) for x in err.get("loc", ())) or None
            raise APIError(400, f"{param}: {err.get('msg')}" if param else err.get("msg"), param=param) from None
        if getattr(req, "model", None) not in (None, self.model_name):
            raise APIError(404, f"The model `{req.model}` does not exist (this server serves "
                                f"`{self.model_name}`)", param="model", code="model_not_found")
        return req

    # -- shared by both endpoints ------------------------------------------------------------

    def choice_seeds(self, seed, n):
        if seed is None:
            return [None] * n
        # choice 0 keeps the request's seed (so n=1 and the first of n>1 agree); the others get
        # independent streams derived from it
        return [seed] + [int(np.random.SeedSequence([seed, i]).generate_state(1, np.uint64)[0] >> 1)
                         for i in range(1, n)]

    async def submit_all(self, prompts, n, body, **kwargs):
        """One engine request per (prompt, choice), submitted in a worker thread (tokenizing a
        long prompt must not stall the event loop); on any failure the ones made are cancelled."""
        sampling = body.sampling()
        seeds = self.choice_seeds(sampling.pop("seed", None), n)
        streams = []
        try:
            for prompt in prompts:
                for i in range(n):
                    s = await run_in_threadpool(self.engine.submit, prompt, seed=seeds[i], **sampling, **kwargs)
                    streams.append(s)
        except BaseException as exc:
            for s in streams:
                s.cancel()
            if isinstance(exc, Exception):
                raise _engine_error(exc) from None
            raise
        return streams

    def token_text(self, token: int) -> str:
        t = self._token_text.get(token)
        if t is None:
            t = self._token_text[token] = self.tok.token_bytes(token).decode("utf-8", "replace")
        return t

    def chat_logprobs(self, lps):
        return None if lps is None else chat_logprobs(self.tok, lps, self.token_text)

    def completion_logprobs(self, lps, start_offset=0):
        """OpenAI's completions logprobs: tokens, token_logprobs, top_logprobs, text_offset."""
        tokens, values, tops, offsets = [], [], [], []
        data, offset = b"", start_offset
        for lp in lps:
            offsets.append(offset)
            tokens.append(self.token_text(lp.token))
            if lp.logprob is None:  # the first prompt token: nothing before it to predict it
                values.append(None)
                tops.append(None)
            else:
                values.append(finite_logprob(lp.logprob))
                tops.append({self.token_text(t): finite_logprob(v) for t, v in lp.top} if lp.top else None)
            data += self.tok.token_bytes(lp.token)
            offset = start_offset + len(data.decode("utf-8", "replace"))
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


async def _merge(streams):
    """Outputs of several streams as they come: (index, Output)."""
    queue = asyncio.Queue()

    async def pump(i, s):
        try:
            async for out in s:
                await queue.put((i, out, None))
        except Exception as exc:
            await queue.put((i, None, exc))
        await queue.put((i, None, StopAsyncIteration()))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    left = len(streams)
    try:
        while left:
            i, out, exc = await queue.get()
            if isinstance(exc, StopAsyncIteration):
                left -= 1
                continue
            if exc is not None:
                raise exc
            yield i, out
    finally:
        for t in tasks:
            t.cancel()
        for s in streams:
            s.cancel()


async def _collect(request: Request, streams):
    """Wait for every stream's Completion; a client that goes away cancels them all."""
    async def watch():
        while True:
            await asyncio.sleep(0.5)
            if await request.is_disconnected():
                return
    gathered = asyncio.ensure_future(asyncio.gather(*(s.aresult() for s in streams)))
    watcher = asyncio.ensure_future(watch())
    try:
        done, _ = await asyncio.wait({gathered, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if gathered in done:
            return gathered.result()
        gathered.cancel()
        raise APIError(499, "client closed the request")
    finally:
        watcher.cancel()
        for s in streams:
            s.cancel()


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _finish_reason(reason: str) -> str:
    # the engine's "cancelled" only reaches a client when the server itself ends the request
    return "length" if reason == "cancelled" else reason


def create_app(engine, model_name: str = None, api_key: str = None, max_body_bytes: int = MAX_BODY_BYTES,
               cors_origins=None) -> FastAPI:
    """The ASGI app serving `engine` as `model_name` (default: the model file's name)."""
    srv = Server(engine, model_name or engine.model.name, api_key, max_body_bytes)
    app = FastAPI(title="qwenc", version=__version__, docs_url=None, redoc_url=None)
    app.state.server = srv
    if cors_origins:
        from fastapi.middleware.cors import CORSMiddleware
        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])

    app.add_middleware(_CountRequests, metrics=srv.metrics)

    @app.exception_handler(APIError)
    async def api_error(request, exc: APIError):
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc: StarletteHTTPException):
        kind = {404: "not_found_error", 405: "invalid_request_error"}.get(exc.status_code, "invalid_request_error")
        message = "no such route: " + request.url.path if exc.status_code == 404 else str(exc.detail)
        return APIError(exc.status_code, message, kind).response()

    @app.exception_handler(Exception)
    async def any_error(request, exc: Exception):
        return _engine_error(exc).response()

    # -- informational -----------------------------------------------------------------------

    @app.get("/health")
    async def health():
        if not engine.alive:
            raise APIError(503, "the engine is not running", "server_error")
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        return Response(generate_latest(srv.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def model_card():
        return {"id": srv.model_name, "object": "model", "created": P.now(), "owned_by": "qwenc",
                "max_model_len": engine.max_tokens_per_request}

    @app.get("/v1/models")
    async def models(request: Request):
        srv.authorize(request)
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def model_info(name: str, request: Request):
        srv.authorize(request)
        if name != srv.model_name:
            raise APIError(404, f"The model `{name}` does not exist", "not_found_error", "model", "model_not_found")
        return model_card()

    # -- tokens ------------------------------------------------------------------------------

    @app.post("/tokenize", openapi_extra=_body_schema(P.TokenizeRequest))
    async def tokenize(request: Request):
        srv.authorize(request)
        body = await srv.body(request, P.TokenizeRequest)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give exactly one of prompt and messages", param="prompt")
        try:
            if body.messages is not None:  # the prompt a chat request with these parts is given
                msgs = P.ChatCompletionRequest(messages=body.messages).template_messages()
                tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
                text = await run_in_threadpool(render_chat, srv.model, msgs, body.add_generation_prompt, tools,
                                               **(body.chat_template_kwargs or {}))
            else:
                text = body.prompt
            ids = await run_in_threadpool(srv.tok.encode, text, body.add_special_tokens)
        except ValueError as exc:
            raise _engine_error(exc if isinstance(exc, QwencError) else InvalidRequest(str(exc))) from None
        return {"tokens": ids, "count": len(ids), "max_model_len": engine.max_tokens_per_request}

    @app.post("/detokenize", openapi_extra=_body_schema(P.DetokenizeRequest))
    async def detokenize(request: Request):
        srv.authorize(request)
        body = await srv.body(request, P.DetokenizeRequest)
        bad = srv.tok.first_non_token(body.tokens) if body.tokens else None
        if bad is not None:
            raise APIError(400, f"token id {bad} is not a token of this model's vocabulary "
                                f"({srv.tok.vocab_size} tokens)", param="tokens")
        return {"prompt": srv.tok.decode(body.tokens)}

    # -- chat --------------------------------------------------------------------------------

    @app.post("/v1/chat/completions", openapi_extra=_body_schema(P.ChatCompletionRequest))
    async def chat(request: Request):
        srv.authorize(request)
        body = await srv.body(request, P.ChatCompletionRequest)
        tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
        try:
            messages = body.template_messages()
            constraint = body.constraint(body.response_format)
            chat_req = await run_in_threadpool(ChatRequest, srv.model, messages, tools, body.tool_choice,
                                               body.parallel_tool_calls, constraint, body.chat_template_kwargs)
        except QwencError as exc:
            raise _engine_error(exc) from None
        except ValueError as exc:
            raise APIError(400, str(exc), param="messages") from None
        max_tokens = body.max_completion_tokens or body.max_tokens
        kwargs = dict(max_tokens=max_tokens, stop=body.stop, stop_token_ids=body.stop_token_ids,
                      ignore_eos=body.ignore_eos, logprobs=body.logprobs, top_logprobs=body.top_logprobs or 0,
                      constraint=chat_req.constraint, thinking=chat_req.thinking)
        streams = await srv.submit_all([chat_req.prompt], body.n, body, **kwargs)
        rid, created = P.new_id("chatcmpl"), P.now()
        meta = {"id": rid, "created": created, "model": srv.model_name, "system_fingerprint": srv.fingerprint}
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(_chat_events(srv, streams, meta, include_usage, body.logprobs, chat_req),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        results = await _collect(request, streams)
        choices = []
        for i, c in enumerate(results):
            parser = chat_req.parser()
            parser.push(c.text)
            parser.finish()
            reason = _finish_reason(chat_req.finish_reason(c.finish_reason, parser))
            choices.append({"index": i, "message": parser.message(),
                            "logprobs": srv.chat_logprobs(c.logprobs) if body.logprobs else None,
                            "finish_reason": reason})
        return {**meta, "object": "chat.completion", "choices": choices,
                "usage": P.usage(results[0].prompt_tokens, sum(c.completion_tokens for c in results),
                                 results[0].cached_tokens)}

    # -- completions -------------------------------------------------------------------------

    @app.post("/v1/completions", openapi_extra=_body_schema(P.CompletionRequest))
    async def completions(request: Request):
        srv.authorize(request)
        body = await srv.body(request, P.CompletionRequest)
        if body.suffix is not None and body.echo:
            raise APIError(400, "echo cannot be used with suffix", param="echo")
        if body.best_of not in (None, body.n):
            raise APIError(400, "best_of other than n is not supported", param="best_of")
        try:
            prompts = body.prompts()
        except ValueError as exc:
            raise APIError(400, str(exc), param="prompt") from None
        if len(prompts) * body.n > P.MAX_N * 4:
            raise APIError(400, f"at most {P.MAX_N * 4} completions per request", param="prompt")
        want_lp = body.logprobs is not None
        try:
            constraint = body.constraint(body.response_format)
        except QwencError as exc:
            raise _engine_error(exc) from None
        except ValueError as exc:
            raise APIError(400, str(exc), param="guided_json") from None
        kwargs = dict(max_tokens=body.max_tokens, stop=body.stop, stop_token_ids=body.stop_token_ids,
                      ignore_eos=body.ignore_eos, logprobs=want_lp, top_logprobs=body.logprobs or 0,
                      prompt_logprobs=want_lp and body.echo, constraint=constraint, suffix=body.suffix)
        streams = await srv.submit_all(prompts, body.n, body, **kwargs)
        n = body.n
        rid, created = P.new_id("cmpl"), P.now()
        meta = {"id": rid, "created": created, "model": srv.model_name, "system_fingerprint": srv.fingerprint}
        echo_text = [srv.tok.decode(s.prompt_ids) if body.echo else "" for s in streams]
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(_completion_events(srv, streams, meta, include_usage, want_lp, echo_text, n),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        results = await _collect(request, streams)
        choices = []
        for i, c in enumerate(results):
            lp = None
            if want_lp:
                lp = srv.completion_logprobs((c.prompt_logprobs or []) + (c.logprobs or [])) if body.echo \
                    else srv.completion_logprobs(c.logprobs or [], 0)
            choices.append({"index": i, "text": echo_text[i] + c.text, "logprobs": lp,
                            "finish_reason": _finish_reason(c.finish_reason)})
        n_prompt = sum(c.prompt_tokens for c in results[::body.n])
        return {**meta, "object": "text_completion", "choices": choices,
                "usage": P.usage(n_prompt, sum(c.completion_tokens for c in results),
                                 sum(c.cached_tokens for c in results[::body.n]))}

    return app


class _CountRequests:
    """Counts responses by route and status (a plain ASGI middleware: it must not stand between
    a streaming response and the client's disconnect)."""

    def __init__(self, app, metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = {"code": 500}

        async def send_status(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)
        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            self.metrics.http.labels(getattr(route, "path", "other"), str(status["code"])).inc()


def _body_schema(model_cls) -> dict:
    """The request body's schema for /openapi.json (the routes parse bodies themselves, to bound
    their size and shape errors the OpenAI way)."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model_cls.model_json_schema()}}}}


async def _chat_events(srv, streams, meta, include_usage, want_logprobs, chat_req):
    base = {**meta, "object": "chat.completion.chunk"}

    def chunk(i, delta, finish=None, logprobs=None):
        return _sse({**base, "choices": [{"index": i, "delta": delta, "logprobs": logprobs,
                                          "finish_reason": finish}]})
    finals = {}
    parsers = [chat_req.parser() for _ in streams]
    try:
        for i in range(len(streams)):
            yield chunk(i, {"role": "assistant", "content": ""})
        async for i, out in _merge(streams):
            lp = srv.chat_logprobs(out.logprobs) if want_logprobs and out.logprobs else None
            deltas = parsers[i].push(out.text) if out.text else []
            if out.finished:
                deltas += parsers[i].finish()
            for d in deltas:
                yield chunk(i, d, None, lp)
                lp = None
            if lp:  # tokens whose text is held back still report their logprobs
                yield chunk(i, {}, None, lp)
            if out.finished:
                finals[i] = out
                yield chunk(i, {}, _finish_reason(chat_req.finish_reason(out.finish_reason, parsers[i])))
        if include_usage:
            first = finals.get(0)
            yield _sse({**base, "choices": [], "usage": P.usage(
                first.prompt_tokens if first else 0, sum(o.completion_tokens for o in finals.values()),
                first.cached_tokens if first else 0)})
    except Exception as exc:
        err = _engine_error(exc)
        yield _sse(P.error_body(err.message, err.type, err.param, err.code))
    yield "data: [DONE]\n\n"


async def _completion_events(srv, streams, meta, include_usage, want_logprobs, echo_text, n):
    base = {**meta, "object": "text_completion"}
    n_streams = len(streams)

    def chunk(i, text, finish=None, logprobs=None):
        return _sse({**base, "choices": [{"index": i, "text": text, "logprobs": logprobs, "finish_reason": finish}]})
    finals = {}
    offsets = [len(t) for t in echo_text]
    try:
        for i in range(n_streams):
            if echo_text[i]:
                yield chunk(i, echo_text[i])
        async for i, out in _merge(streams):
            lp = None
            if want_logprobs:
                entries = (out.prompt_logprobs or []) + (out.logprobs or []) if echo_text[i] else (out.logprobs or [])
                if entries:
                    lp = srv.completion_logprobs(entries, 0 if out.prompt_logprobs else offsets[i])
            if out.text or lp:
                yield chunk(i, out.text, None, lp)
                offsets[i] += len(out.text)
            if out.finished:
                finals[i] = out
                yield chunk(i, "", _finish_reason(out.finish_reason))
        if include_usage:
            firsts = [o for i, o in finals.items() if i % n == 0]  # each prompt counted once
            yield _sse({**base, "choices": [], "usage": P.usage(
                sum(o.prompt_tokens for o in firsts), sum(o.completion_tokens for o in finals.values()),
                sum(o.cached_tokens for o in firsts))})
    except Exception as exc:
        err = _engine_error(exc)
        yield _sse(P.error_body(err.message, err.type, err.param, err.code))
    yield "data: [DONE]\n\n"
