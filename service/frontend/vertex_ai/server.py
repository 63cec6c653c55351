"""Vertex AI's prediction API (`--allow-vertex-ai=true`), as Triton's vertex_ai_server.cc.

Two routes from the environment Vertex AI sets: AIP_HEALTH_ROUTE (GET: 200 when the server is ready, else 400)
and AIP_PREDICT_ROUTE (POST: Triton's infer on the default model, `--vertex-ai-default-model` or the only model
loaded). A prediction request with the header `X-Vertex-Ai-Triton-Redirect: <triton path>` goes to that Triton
route instead (the method is set to what the route expects): server and model metadata, health, readiness,
config, statistics, infer, `/metrics`, shared-memory status and the repository index; shared-memory
(un)registration and model load/unload are 403; anything else, and any other path, is 400 with an empty body.
Binary tensors may be announced in the Content-Type as
`application/vnd.vertex-ai-triton.binary+json;json-header-size=N`.

The handlers are the HTTP front end's (service/frontend/http); this module routes Vertex AI's paths to them.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Awaitable, Callable

from service.config.groups.cloud import VertexAiOptions
from service.core.engine import Engine
from service.errors import ServiceError
from service.frontend.http.h1 import H1Server
from service.frontend.http.message import Request, Response, Stream
from service.frontend.http.mime import announce_header_length
from service.frontend.http.server import HttpFrontend, HttpOptions
from service.frontend.http.util import error_response
from service.frontend.metrics import CONTENT_TYPE

log = logging.getLogger("trireme.vertex_ai")

BINARY_MIME = "application/vnd.vertex-ai-triton.binary+json;json-header-size="
REDIRECT_HEADER = "X-Vertex-Ai-Triton-Redirect"

_MODEL = re.compile(r"/v2/models/[^/]+(?:/versions/[0-9]+)?(?:/(ready|infer|config|stats))?\Z")
_SERVER = re.compile(r"/v2(?:/health/(?:live|ready))?\Z")
_SHM = re.compile(r"/v2/(?:system|cuda)sharedmemory(?:/region/[^/]+)?/(status|register|unregister)\Z")
_REPOSITORY = re.compile(r"/v2/repository(?:/[^/]+)?/(index|models/[^/]+/(?:load|unload))\Z")


class VertexAiFrontend:
    """The Vertex AI listener (in the core process, beside /metrics)."""

    def __init__(
        self, engine: Engine, options: VertexAiOptions, http: HttpOptions, metrics: Callable[[], bytes] | None
    ) -> None:
        self.engine = engine
        self.options = options
        self.shutdown_timeout_s = http.shutdown_timeout_s
        self._http = HttpFrontend(engine, HttpOptions(max_input_size=http.max_input_size, restricted=http.restricted))
        self._metrics = metrics
        try:  # Triton matches the whole path against each route as a regular expression
            self._predict = re.compile(options.predict_route)
            self._health = re.compile(options.health_route)
        except re.error as e:
            raise OSError(f"AIP_PREDICT_ROUTE / AIP_HEALTH_ROUTE is not a valid regular expression: {e}") from None
        self.model = ""
        self._server: H1Server | None = None
        self.port = 0

    def handle(self, request: Request) -> Awaitable[Response | Stream]:
        path = request.path
        if self._health.fullmatch(path):
            request.path = "/v2/health/ready"
            return self._http.handle(request)
        if not self._predict.fullmatch(path):
            return _empty(400)
        target = request.headers.get(REDIRECT_HEADER)
        if target is None:
            request.path = f"/v2/models/{self.model}/infer"
            return self._infer(request)
        if request.method != "POST":
            return _empty(405)
        return self._redirect(request, "/" + target)

    def _redirect(self, request: Request, path: str) -> Awaitable[Response | Stream]:
        log.debug("Redirecting Vertex AI request: %s", path)
        request.path = path
        if path == "/metrics":
            return self._render_metrics()
        if path == "/v2/models/stats" or _SERVER.match(path):
            request.method = "GET"
            return self._http.handle(request)
        m = _MODEL.match(path)
        if m is not None:
            if m.group(1) == "infer":
                return self._infer(request)
            request.method = "GET"
            return self._http.handle(request)
        m = _SHM.match(path)
        if m is not None:
            if m.group(1) != "status":
                return _empty(403)  # only read-only queries go through the redirect
            request.method = "GET"
            return self._http.handle(request)
        m = _REPOSITORY.match(path)
        if m is not None:
            return self._http.handle(request) if m.group(1) == "index" else _empty(403)
        return _empty(400)

    async def _infer(self, request: Request) -> Response | Stream:
        try:
            announce_header_length(request, BINARY_MIME)
        except ServiceError as e:
            return error_response(e)
        return await self._http.handle(request)

    async def _render_metrics(self) -> Response:
        if self._metrics is None:  # --allow-metrics=false: Triton has no metrics to give either
            return Response(400)
        try:
            return Response(200, self._metrics(), CONTENT_TYPE)
        except Exception:
            log.exception("rendering /metrics for a Vertex AI redirect failed")
            return Response(400)

    def default_model(self) -> str:
        """--vertex-ai-default-model, which must be loaded, else the only model loaded (Triton's checks)."""
        ready = [e.name for e in self.engine.repository_index(ready_only=True)]
        name = self.options.default_model
        if not name:
            if len(set(ready)) != 1:
                raise OSError(
                    "Expect the model repository contains only a single model if default model is not specified"
                )
            return ready[0]
        if name not in ready:
            raise OSError(f"Expect the default model '{name}' is loaded")
        return name

    async def start(self) -> int:
        """Check the environment and the default model, bind and serve; returns the bound port."""
        opts = self.options
        if not opts.predict_route:
            raise OSError("API_PREDICT_ROUTE is not defined for Vertex AI endpoint")  # sic: Triton's message
        if not opts.health_route:
            raise OSError("AIP_HEALTH_ROUTE is not defined for Vertex AI endpoint")
        self.model = self.default_model()
        family = socket.AF_INET6 if ":" in opts.address else socket.AF_INET
        sock = socket.create_server((opts.address, opts.port), family=family, backlog=1024)
        self._server = H1Server(self.handle)
        await self._server.start(sock, None)
        self.port = int(sock.getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(self.shutdown_timeout_s)
            self._server = None


async def _empty(status: int) -> Response:
    return Response(status)
