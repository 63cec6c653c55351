"""The HTTP/REST front end: KServe v2 + Triton's extensions, in the server's event loop, over Engine.

Every path answers Triton's status codes with `{"error": "..."}` bodies (one table: status.HTTP_STATUS); an
unknown path is 404 `{"error": "Not Found"}`, a known path with the wrong method 405
`{"error": "Method Not Allowed"}`. Inference bodies are translated by http_codec; the admin endpoints
(repository, shared memory, logging, trace) live in http_admin and generate/generate_stream in http_generate.
The connections (HTTP/1.1 parsing, keep-alive, streaming) are h1.py's; handlers see message.Request.
"""

from __future__ import annotations

import re
import socket
import ssl
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field

from mypy_extensions import mypyc_attr

from service.config.access import RestrictedApi
from service.core.facade import Facade
from service.core.repository.model_config import to_json_dict
from service.errors import ErrorCode, ServiceError, invalid_arg
from service.frontend.http import admin as http_admin
from service.frontend.http import codec
from service.frontend.http import generate as http_generate
from service.frontend.http.h1 import H1Server
from service.frontend.http.message import JSON, BodyError, Request, Response, Stream
from service.frontend.http.routing import Handler, Router
from service.frontend.http.util import (
    compress_if_asked,
    error_json,
    error_response,
    json_response,
    read_body,
    whole_body,
)
from service.types import InferRequest

_MODEL = r"/v2/models/{model}"
_VERSIONED = (_MODEL, _MODEL + "/versions/{version:[0-9]+}")


async def _not_found() -> Response:
    return error_json("Not Found", 404)


@dataclass(slots=True)
class HttpOptions:
    """What the HTTP front end takes from the command line."""

    address: str = "0.0.0.0"
    port: int = 8000
    max_input_size: int = 64 << 20
    header_forward_pattern: str = ""
    reuse_port: bool = False
    shutdown_timeout_s: float = 30.0
    restricted: list[RestrictedApi] = field(default_factory=list)  # --http-restricted-api rules
    ssl_context: ssl.SSLContext | None = None  # HTTPS (--http-use-ssl); None: plain HTTP
    # a socket bound elsewhere to serve instead of binding address:port: a front-end process's, inherited from
    # the core, which every front end accepts from (service/remote/supervisor.py)
    sock: socket.socket | None = None


def listening_socket(address: str, port: int, reuse_port: bool) -> socket.socket:
    """The HTTP port's listening socket (port 0 picks one); OSError when the address is taken. One process's front
    end binds it in start(); with front-end processes the core binds it once for all (service/remote/ports.py)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    return socket.create_server((address, port), family=family, backlog=1024, reuse_port=reuse_port)


@mypyc_attr(allow_interpreted_subclasses=True)  # SageMaker's infer route (frontend/sagemaker) subclasses it
class HttpFrontend:
    """The route table, its handlers and the listener."""

    def __init__(self, engine: Facade, options: HttpOptions) -> None:
        self.engine = engine
        self.options = options
        # header names are case-insensitive: Triton matches the pattern with (?i) too
        pattern = options.header_forward_pattern
        self._forward = re.compile(pattern, re.IGNORECASE) if pattern else None
        self._router = self.build_routes()
        self._server: H1Server | None = None
        self.port = 0

    # ---- routing -----------------------------------------------------------------------------------------
    def build_routes(self) -> Router:
        """All routes; each path takes every method and answers 405 itself for the ones it does not serve."""
        router = Router()
        admin = http_admin.AdminRoutes(self.engine, self.options.max_input_size)
        generate = http_generate.GenerateRoutes(self.engine, self.options.max_input_size)

        rules = {group: rule for rule in self.options.restricted for group in rule.groups}

        def route(path: str, group: str, **methods: Handler) -> None:
            router.add(path, self._dispatch(methods, rules.get(group)))

        route("/v2", "metadata", GET=self.server_metadata)
        route("/v2/health/live", "health", GET=self.live)
        route("/v2/health/ready", "health", GET=self.ready)
        route("/v2/models/stats", "statistics", GET=self.statistics)
        for base in _VERSIONED:
            route(base, "metadata", GET=self.model_metadata)
            route(base + "/ready", "health", GET=self.model_ready)
            route(base + "/config", "model-config", GET=self.model_config)
            route(base + "/stats", "statistics", GET=self.statistics)
            route(base + "/infer", "inference", POST=self.infer)
            route(base + "/generate", "inference", POST=generate.generate)
            route(base + "/generate_stream", "inference", POST=generate.generate_stream)
        admin.add_routes(route)
        return router

    def handle(self, request: Request) -> Awaitable[Response | Stream]:
        """Every request: its route's handler, or 404 `{"error": "Not Found"}` (the handler's own awaitable: no
        coroutine of its own in between)."""
        found = self._router.resolve(request.path)
        if found is None:
            return _not_found()
        handler, request.match_info = found
        return handler(request)

    @staticmethod
    def _dispatch(methods: dict[str, Handler], rule: RestrictedApi | None) -> Handler:
        """One path's handler: method check, then the restricted-API header check of its group, then the call."""

        async def dispatch(request: Request) -> Response | Stream:
            handler = methods.get(request.method)
            if handler is None:
                return error_json("Method Not Allowed", 405)
            if rule is not None and request.headers.get(rule.key) != rule.value:
                return error_json(f"This API is restricted, expecting header '{rule.key}'", 403)
            try:
                return await handler(request)
            except ConnectionResetError:  # the client went away while its body was read: nobody to answer
                return error_json("client closed the connection", 400)
            except BodyError as e:  # the body stopped parsing after the handler started
                return error_json(f"malformed HTTP request body: {e}", 400)
            except Exception as e:
                return error_response(e)

        return dispatch

    # ---- lifecycle -----------------------------------------------------------------------------------------
    async def start(self) -> int:
        """Bind and serve; returns the bound port (port 0 picks a free one). Raises OSError when it cannot bind."""
        opts = self.options
        sock = opts.sock if opts.sock is not None else listening_socket(opts.address, opts.port, opts.reuse_port)
        self._server = H1Server(self.handle)
        await self._server.start(sock, opts.ssl_context)
        self.port = int(sock.getsockname()[1])
        return self.port

    async def stop(self) -> None:
        """Stop listening and let in-flight requests finish (up to the shutdown timeout)."""
        if self._server is not None:
            await self._server.stop(self.options.shutdown_timeout_s)
            self._server = None

    # ---- health and metadata -------------------------------------------------------------------------------
    async def live(self, request: Request) -> Response:
        """200 when live, 400 otherwise; empty body."""
        return Response(200 if self.engine.live else 400)

    async def ready(self, request: Request) -> Response:
        """200 when ready, 400 otherwise; empty body."""
        return Response(200 if self.engine.server_ready() else 400)

    async def server_metadata(self, request: Request) -> Response:
        """{"name", "version", "extensions"}."""
        name, version, extensions = self.engine.server_metadata()
        return json_response({"name": name, "version": version, "extensions": extensions})

    async def model_ready(self, request: Request) -> Response:
        """200 when that model version is ready; 400 when not, 404 for an unknown model."""
        mi = request.match_info
        if await self.engine.model_ready(mi["model"], mi.get("version", "")):
            return Response(200)
        return error_json("Model version not ready", 400)

    async def model_metadata(self, request: Request) -> Response:
        """Model metadata JSON."""
        mi = request.match_info
        meta = self.engine.model_metadata(mi["model"], mi.get("version", ""))
        return json_response(
            {
                "name": meta.name,
                "versions": meta.versions,
                "platform": meta.platform,
                "inputs": [{"name": t.name, "datatype": t.datatype, "shape": t.shape} for t in meta.inputs],
                "outputs": [{"name": t.name, "datatype": t.datatype, "shape": t.shape} for t in meta.outputs],
            }
        )

    async def model_config(self, request: Request) -> Response:
        """The normalized config as protobuf JSON with numeric int64 fields."""
        mi = request.match_info
        return json_response(to_json_dict(self.engine.model_config(mi["model"], mi.get("version", ""))))

    async def statistics(self, request: Request) -> Response:
        """Statistics JSON with every count/ns key present."""
        mi = request.match_info
        rows = self.engine.statistics(mi.get("model", ""), mi.get("version", ""))
        return json_response({"model_stats": [http_admin.stats_json(n, v, s) for n, v, s in rows]})

    # ---- inference ------------------------------------------------------------------------------------------
    async def infer(self, request: Request) -> Response:
        """POST .../infer: JSON and/or binary tensors in, JSON and/or binary tensors out."""
        mi = request.match_info
        model, version = mi["model"], mi.get("version", "")
        tracing = self.engine.tracer.enabled
        received = time.monotonic_ns() if tracing else 0
        max_size = self.options.max_input_size
        body = whole_body(request, max_size)  # the usual small body, already here: no coroutine to read it
        if body is None:
            body = await read_body(request, max_size)
        req, choice = self._decode(request, body, model, version)
        trace = self.engine.tracer.sample(model, request.headers.get("traceparent", "")) if tracing else None
        if trace is not None:
            trace.stamp("HTTP_RECV_START", received)
            trace.stamp("HTTP_RECV_END")
            req.trace = trace
        try:  # one path, traced or not (the stamps are the only difference)
            response = await self.engine.infer(req)
            if response.error is not None:
                raise self.execution_failed(response.error)
            if trace is not None:
                trace.stamp("HTTP_SEND_START")
            payload, header_length = codec.encode_response(response, choice)
            if trace is not None:
                trace.stamp("HTTP_SEND_END")
        except ServiceError as e:
            if e.code == ErrorCode.UNSUPPORTED and self.engine.is_decoupled(req.model_name, req.model_version):
                raise ServiceError(
                    ErrorCode.UNSUPPORTED, "HTTP end point doesn't support models with decoupled transaction policy"
                ) from None
            raise
        finally:
            if trace is not None:
                trace.finish()
        if header_length < 0:
            out = Response(200, payload, JSON)
        else:
            out = Response(200, payload, "application/octet-stream", {codec.INFER_HEADER: str(header_length)})
        return compress_if_asked(request, out)

    def execution_failed(self, error: ServiceError) -> Exception:
        """What an inference that failed while it ran raises (SageMaker's endpoint answers it with its own codes)."""
        return error

    def _decode(
        self, request: Request, body: bytes, model: str, version: str
    ) -> tuple[InferRequest, codec.OutputChoice]:
        view = memoryview(body)
        text = request.headers.get(codec.INFER_HEADER)
        if text is None:
            req, choice = codec.decode_infer(codec.parse_json(view), view[len(view) :], model, version, False)
        else:
            try:
                length = int(text)
            except ValueError:
                length = -1
            if not 0 <= length <= len(view):
                raise invalid_arg(
                    f"Unable to parse '{codec.INFER_HEADER}': expected 0 <= value <= {len(view)}, got '{text}'"
                )
            if length == 0:
                meta = self.engine.model_metadata(model, version)
                batched = self.engine.model_config(model, version).max_batch_size > 0
                req, choice = codec.decode_raw(view, model, version, meta.inputs, batched)
            else:
                header = codec.parse_json(view[:length])
                req, choice = codec.decode_infer(header, view[length:], model, version, True)
        if self._forward is not None:
            for key, value in request.headers.items():
                if self._forward.search(key):
                    if key.lower() in codec.RESERVED_PARAMETERS or key.lower().startswith("triton_"):
                        # Triton 2.69: a forwarded header must not set what the protocol's own keys mean
                        raise invalid_arg(
                            f"HTTP header '{key}' matches --http-header-forward-pattern but \"{key}\" is a reserved "
                            "parameter and cannot be specified."
                        )
                    req.parameters[key] = value
        return req, choice
