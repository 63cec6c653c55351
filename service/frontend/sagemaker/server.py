"""SageMaker's inference API (`--allow-sagemaker=true`, port `--sagemaker-port`), as Triton's sagemaker_server.cc.

`GET /ping`: server ready (or live: SAGEMAKER_TRITON_PING_MODE=live) -> 200, else 400. `POST /invocations`:
the default model (SAGEMAKER_TRITON_DEFAULT_MODEL_NAME, else the only model loaded) through Triton's infer, or
generate / generate_stream (SAGEMAKER_TRITON_INFERENCE_TYPE). `/models...`: the multi-model endpoint (mme.py).
Any other path is 400 with an empty body. Binary tensors are announced in the Content-Type
(`application/vnd.sagemaker-triton.binary+json;json-header-size=N`) both ways. An inference that fails while it
runs is 400 (507 when the message says the model ran out of memory), as Triton answers SageMaker.

The handlers are the HTTP front end's (service/frontend/http): this module only routes SageMaker's paths to them.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Awaitable

from service.config.groups.cloud import SageMakerOptions
from service.core.engine import Engine
from service.errors import ServiceError
from service.frontend.http.generate import GenerateRoutes
from service.frontend.http.h1 import H1Server
from service.frontend.http.message import Request, Response, Stream
from service.frontend.http.mime import announce_header_length, mime_response
from service.frontend.http.routing import Handler
from service.frontend.http.server import HttpFrontend, HttpOptions
from service.frontend.http.util import error_json
from service.frontend.sagemaker.mme import MultiModel, out_of_memory

log = logging.getLogger("trireme.sagemaker")

BINARY_MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="
UNSPECIFIED_MODEL = "unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"  # Triton's name when none is set
_MODELS = re.compile(r"/models(?:/)?([^/]+)?(/invoke)?\Z")


class ExecutionFailed(ServiceError):
    """An inference that failed while it ran: SageMaker's 400, or 507 for an out-of-memory message."""

    def __init__(self, error: ServiceError) -> None:
        super().__init__(error.code, error.message)
        self.status = 507 if out_of_memory(error.message) else 400


class _SageMakerInfer(HttpFrontend):
    """The HTTP front end's handlers with SageMaker's binary MIME type and execution error codes."""

    def execution_failed(self, error: ServiceError) -> Exception:
        return ExecutionFailed(error)

    async def invoke(self, request: Request, model: str) -> Response | Stream:
        request.match_info = {"model": model}
        announce_header_length(request, BINARY_MIME)
        try:
            response = await self.infer(request)
        except ExecutionFailed as e:
            return error_json(e.message, e.status)
        return mime_response(response, BINARY_MIME)


class SageMakerFrontend:
    """The SageMaker listener; it runs in the core process (the multi-model endpoint loads models)."""

    def __init__(self, engine: Engine, options: SageMakerOptions, http: HttpOptions) -> None:
        self.engine = engine
        self.options = options
        self.http = http
        self._infer = _SageMakerInfer(engine, HttpOptions(max_input_size=http.max_input_size))
        generate = GenerateRoutes(engine, http.max_input_size)
        rules = {group: rule for rule in http.restricted for group in rule.groups}

        def guard(group: str, **methods: Handler) -> Handler:
            return HttpFrontend._dispatch(methods, rules.get(group))

        self._ping = guard("health", GET=self.ping)
        invocation: dict[str, Handler] = {
            "infer": self.invocations,
            "generate": generate.generate,
            "generate_stream": generate.generate_stream,
        }
        self._invocations = guard("inference", POST=invocation.get(options.inference_type, self.invocations))
        self.mme = MultiModel(engine, options.models_root, self._infer.invoke, guard)
        self.model = ""
        self._server: H1Server | None = None
        self.port = 0

    def handle(self, request: Request) -> Awaitable[Response | Stream]:
        """Route one request (an awaitable: the handler's own)."""
        path = request.path
        if path == "/ping":
            return self._ping(request)
        if path == "/invocations":
            request.match_info = {"model": self.model}
            return self._invocations(request)
        m = _MODELS.match(path)
        if m is not None:
            return self.mme.handle(request, m.group(1) or "", m.group(2) or "")
        return _bad_request()

    async def ping(self, request: Request) -> Response:
        """200 when ready (or live, SAGEMAKER_TRITON_PING_MODE=live), 400 otherwise; empty body."""
        ok = self.engine.live if self.options.ping_mode == "live" else self.engine.server_ready()
        return Response(200 if ok else 400)

    async def invocations(self, request: Request) -> Response | Stream:
        return await self._infer.invoke(request, self.model)

    def default_model(self) -> str:
        """SAGEMAKER_TRITON_DEFAULT_MODEL_NAME, else the only model the repository has, else Triton's placeholder."""
        if self.options.default_model:
            return self.options.default_model
        names = {entry.name for entry in self.engine.repository_index()}
        return names.pop() if len(names) == 1 else UNSPECIFIED_MODEL

    async def start(self) -> int:
        """Bind and serve; returns the bound port. Raises OSError when it cannot bind."""
        self.model = self.default_model()
        opts = self.options
        family = socket.AF_INET6 if ":" in opts.address else socket.AF_INET
        sock = socket.create_server((opts.address, opts.port), family=family, backlog=1024)
        self._server = H1Server(self.handle)
        await self._server.start(sock, None)
        self.port = int(sock.getsockname()[1])
        log.info("SageMaker endpoint: /invocations -> model '%s' (%s)", self.model, opts.inference_type)
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(self.http.shutdown_timeout_s)
            self._server = None


async def _bad_request() -> Response:
    return Response(400)
