"""The OpenAI-compatible front end: an aiohttp app on --openai-port, in the server's event loop, over Engine.

Routes: GET /v1/models, GET /v1/models/{model}, POST /v1/models/{model}/load|unload (explicit model control),
POST /v1/completions, /v1/chat/completions, /v1/embeddings, GET /metrics, GET /health/ready. Errors are OpenAI's
error JSON; a body over --http-max-input-size is 413; --openai-restricted-api groups need their header (401).
A client that disconnects cancels its handler (aiohttp handler cancellation), which cancels its requests in the
model.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable, Sequence

import orjson
from aiohttp import web

from service.config.openai import OpenAIOptions, OpenAIRestriction
from service.core.engine import Engine
from service.errors import ErrorCode, ServiceError
from service.frontend.metrics import CONTENT_TYPE, Collector, render
from service.frontend.openai.chat import chat_completions
from service.frontend.openai.completions import completions
from service.frontend.openai.context import Context
from service.frontend.openai.embeddings import embeddings
from service.frontend.openai.errors import JSON, OpenAIError, bad_request, error_response, model_not_found
from service.frontend.openai.template import ChatTemplates

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
BodyHandler = Callable[[Context, web.Request, bytes], Awaitable[web.StreamResponse]]


class OpenAIFrontend:
    """The app and its listener."""

    def __init__(self, engine: Engine, options: OpenAIOptions, collectors: Sequence[Collector] | None) -> None:
        self.engine = engine
        self.options = options
        self.collectors = collectors  # None: --allow-metrics=false
        self.ctx = Context(engine, options, ChatTemplates(options.tokenizer, options.chat_template))
        self._runner: web.AppRunner | None = None
        self.port = 0

    def build_app(self) -> web.Application:
        """Every route, each behind its restricted-API group."""
        app = web.Application(client_max_size=self.options.max_input_size)
        rules = {group: rule for rule in self.options.restricted for group in rule.groups}

        def route(method: str, path: str, group: str, handler: Handler) -> None:
            app.router.add_route(method, path, self._guard(rules.get(group), handler))

        route("GET", "/v1/models", "model-repository", self.list_models)
        route("GET", "/v1/models/{model}", "model-repository", self.get_model)
        route("POST", "/v1/models/{model}/load", "model-management", self.load_model)
        route("POST", "/v1/models/{model}/unload", "model-management", self.unload_model)
        route("POST", "/v1/completions", "inference", self._with_body(completions))
        route("POST", "/v1/chat/completions", "inference", self._with_body(chat_completions))
        route("POST", "/v1/embeddings", "embedding", self._with_body(embeddings))
        route("GET", "/metrics", "metrics", self.metrics)
        route("GET", "/health/ready", "health", self.ready)
        app.router.add_route("*", "/{tail:.*}", self.not_found)
        return app

    @staticmethod
    def _guard(rule: OpenAIRestriction | None, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            if rule is not None and request.headers.get(rule.key) != rule.value:
                message = f"This API is restricted, expecting header '{rule.key}' with valid value"
                return error_response(OpenAIError(401, message, "invalid_auth"))
            try:
                return await handler(request)
            except ConnectionResetError:  # the client went away mid-answer: nothing to send
                return web.Response(status=499)
            except Exception as e:
                return error_response(e)

        return guarded

    def _with_body(self, handler: BodyHandler) -> Handler:
        async def with_body(request: web.Request) -> web.StreamResponse:
            return await handler(self.ctx, request, await self._read_body(request))

        return with_body

    async def _read_body(self, request: web.Request) -> bytes:
        """The body, refused with 413 past the limit (by Content-Length before reading, else while reading)."""
        limit = self.options.max_input_size
        if request.content_length is not None and request.content_length > limit:
            raise self._too_large(request.content_length)
        chunks: list[bytes] = []
        size = 0
        while chunk := await request.content.readany():
            size += len(chunk)
            if size > limit:
                raise self._too_large(size)
            chunks.append(chunk)
        return b"".join(chunks)

    def _too_large(self, size: int) -> OpenAIError:
        return OpenAIError(
            413,
            f"Request size of {size} bytes exceeds the maximum allowed input size of {self.options.max_input_size} "
            "bytes. Use --http-max-input-size to increase the limit.",
            "content_too_large",
        )

    async def not_found(self, request: web.Request) -> web.Response:
        """Any other path (or method)."""
        return error_response(OpenAIError(404, f"Unknown route: {request.method} {request.path}", "not_found"))

    # ---- models ---------------------------------------------------------------------------------------------
    async def list_models(self, request: web.Request) -> web.Response:
        """{"object": "list", "data": [Model, ...]}."""
        data = [self.ctx.model_json(m) for m in self.ctx.model_ids()]
        return _json({"object": "list", "data": data})

    async def get_model(self, request: web.Request) -> web.Response:
        """One Model, or 404."""
        model = request.match_info["model"]
        if model not in self.ctx.model_ids():
            raise model_not_found(model)
        return _json(self.ctx.model_json(model))

    def _check_explicit(self) -> None:
        if self.engine.model_control_mode != "explicit":
            raise bad_request("model load and unload need --model-control-mode=explicit")

    async def load_model(self, request: web.Request) -> web.Response:
        """Load (or reload) a model; answers its Model object once it is ready."""
        self._check_explicit()
        model = request.match_info["model"]
        try:
            await self.engine.load_model(model)
        except ServiceError as e:
            if e.code == ErrorCode.NOT_FOUND:
                raise model_not_found(model) from None
            raise OpenAIError(400, e.message) from None
        return _json(self.ctx.model_json(model))

    async def unload_model(self, request: web.Request) -> web.Response:
        """Unload a model (requests in flight finish first)."""
        self._check_explicit()
        model = request.match_info["model"]
        try:
            await self.engine.unload_model(model)
        except ServiceError as e:
            raise OpenAIError(400, e.message) from None
        return _json({"status": "success", "model": model})

    # ---- observability --------------------------------------------------------------------------------------
    async def metrics(self, request: web.Request) -> web.Response:
        """The same Prometheus text as the metrics port (404 with --allow-metrics=false)."""
        if self.collectors is None:
            raise OpenAIError(404, "metrics are disabled (--allow-metrics=false)", "not_found")
        return web.Response(body=render(self.collectors), headers={"Content-Type": CONTENT_TYPE})

    async def ready(self, request: web.Request) -> web.Response:
        """200 when the server is ready, 503 otherwise."""
        if self.engine.server_ready():
            return web.Response(status=200)
        return error_response(OpenAIError(503, "the server is not ready", "not_ready"))

    # ---- lifecycle ------------------------------------------------------------------------------------------
    async def start(self) -> int:
        """Bind and serve; returns the bound port (0 picks a free one). OSError when it cannot bind."""
        opts = self.options
        family = socket.AF_INET6 if ":" in opts.address else socket.AF_INET
        sock = socket.create_server((opts.address, opts.port or 0), family=family, backlog=1024)
        # handler_cancellation: a client that goes away cancels its handler, and so its requests in the model
        self._runner = web.AppRunner(self.build_app(), access_log=None, handle_signals=False, handler_cancellation=True)
        await self._runner.setup()
        await web.SockSite(self._runner, sock, backlog=1024).start()
        self.port = int(sock.getsockname()[1])
        return self.port

    async def stop(self) -> None:
        """Stop listening; requests in flight finish."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def _json(value: object) -> web.Response:
    return web.Response(body=orjson.dumps(value), content_type=JSON)
