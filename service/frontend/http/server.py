"""The HTTP/REST front end: KServe v2 + Triton's extensions on aiohttp, in the server's event loop, over Engine.

Every path answers Triton's status codes with `{"error": "..."}` bodies (one table: status.HTTP_STATUS); an
unknown path is 404 `{"error": "Not Found"}`, a known path with the wrong method 405
`{"error": "Method Not Allowed"}`. Inference bodies are translated by http_codec; the admin endpoints
(repository, shared memory, logging, trace) live in http_admin and generate/generate_stream in http_generate.
"""

from __future__ import annotations

import logging
import re
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage
from aiohttp.web_protocol import RequestPayloadError

from service.config.access import RestrictedApi
from service.core.facade import Facade
from service.core.repository.model_config import to_json_dict
from service.errors import ErrorCode, ServiceError, invalid_arg
from service.frontend.http import admin as http_admin
from service.frontend.http import codec
from service.frontend.http import generate as http_generate
from service.frontend.http.protocol import use_failing_payloads
from service.frontend.http.util import JSON, compress_if_asked, error_body, error_response, json_response, read_body
from service.types import InferRequest, InferResponse

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _one_line_for_bad_requests(record: logging.LogRecord) -> bool:
    """A request the HTTP parser refuses (e.g. both Content-Length and Transfer-Encoding: chunked, which could
    smuggle a second request) is answered 400 with the parser's reason; log that reason in one line, without the
    traceback aiohttp attaches."""
    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, RequestPayloadError):  # the rest of an answered request's body does not decode
        record.msg, record.args = "dropped an undecodable HTTP request body: %s", (" ".join(str(exc).split()),)
        record.exc_info, record.exc_text, record.levelno, record.levelname = None, None, logging.WARNING, "WARNING"
    elif isinstance(exc, BadHttpMessage):
        record.msg, record.args = "refused a malformed HTTP request: %s", (" ".join(str(exc.message).split()),)
        record.exc_info, record.exc_text, record.levelno, record.levelname = None, None, logging.WARNING, "WARNING"
    return True


_MODEL = r"/v2/models/{model}"
_VERSIONED = (_MODEL, _MODEL + "/versions/{version:[0-9]+}")


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


class HttpFrontend:
    """The aiohttp application and its listener."""

    def __init__(self, engine: Facade, options: HttpOptions) -> None:
        self.engine = engine
        self.options = options
        # header names are case-insensitive: Triton matches the pattern with (?i) too
        pattern = options.header_forward_pattern
        self._forward = re.compile(pattern, re.IGNORECASE) if pattern else None
        self._runner: web.AppRunner | None = None
        self.port = 0

    # ---- routing -----------------------------------------------------------------------------------------
    def build_app(self) -> web.Application:
        """All routes; each path takes every method and answers 405 itself for the ones it does not serve."""
        app = web.Application(client_max_size=self.options.max_input_size)
        admin = http_admin.AdminRoutes(self.engine, self.options.max_input_size)
        generate = http_generate.GenerateRoutes(self.engine, self.options.max_input_size)

        rules = {group: rule for rule in self.options.restricted for group in rule.groups}

        def route(path: str, group: str, **methods: Handler) -> None:
            app.router.add_route("*", path, self._dispatch(methods, rules.get(group)))

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
        app.router.add_route("*", "/{tail:.*}", self.not_found)
        return app

    @staticmethod
    def _dispatch(methods: dict[str, Handler], rule: RestrictedApi | None) -> Handler:
        """One path's handler: method check, then the restricted-API header check of its group, then the call."""

        async def dispatch(request: web.Request) -> web.StreamResponse:
            handler = methods.get(request.method)
            if handler is None:
                return web.Response(body=error_body("Method Not Allowed"), status=405, content_type=JSON)
            if rule is not None and request.headers.get(rule.key) != rule.value:
                message = f"This API is restricted, expecting header '{rule.key}'"
                return web.Response(body=error_body(message), status=403, content_type=JSON)
            try:
                return await handler(request)
            except ConnectionResetError:  # the client went away while its body was read: nobody to answer
                return web.Response(body=error_body("client closed the connection"), status=400, content_type=JSON)
            except RequestPayloadError as e:  # the body stopped parsing after the handler started
                return web.Response(body=error_body(f"malformed HTTP request body: {e}"), status=400, content_type=JSON)
            except Exception as e:
                return error_response(e)

        return dispatch

    async def not_found(self, request: web.Request) -> web.Response:
        """Any path that is not one of the protocol's."""
        return web.Response(body=error_body("Not Found"), status=404, content_type=JSON)

    # ---- lifecycle -----------------------------------------------------------------------------------------
    async def start(self) -> int:
        logging.getLogger("aiohttp.server").addFilter(_one_line_for_bad_requests)
        """Bind and serve; returns the bound port (port 0 picks a free one). Raises OSError when it cannot bind."""
        opts = self.options
        family = socket.AF_INET6 if ":" in opts.address else socket.AF_INET
        sock = socket.create_server((opts.address, opts.port), family=family, backlog=1024, reuse_port=opts.reuse_port)
        self._runner = web.AppRunner(
            self.build_app(), access_log=None, handle_signals=False, shutdown_timeout=opts.shutdown_timeout_s
        )
        await self._runner.setup()
        use_failing_payloads(self._runner)
        await web.SockSite(self._runner, sock, backlog=1024, ssl_context=opts.ssl_context).start()
        self.port = int(sock.getsockname()[1])
        return self.port

    async def stop(self) -> None:
        """Stop listening and let in-flight requests finish (up to the shutdown timeout)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ---- health and metadata -------------------------------------------------------------------------------
    async def live(self, request: web.Request) -> web.Response:
        """200 when live, 400 otherwise; empty body."""
        return web.Response(status=200 if self.engine.live else 400)

    async def ready(self, request: web.Request) -> web.Response:
        """200 when ready, 400 otherwise; empty body."""
        return web.Response(status=200 if self.engine.server_ready() else 400)

    async def server_metadata(self, request: web.Request) -> web.Response:
        """{"name", "version", "extensions"}."""
        name, version, extensions = self.engine.server_metadata()
        return json_response({"name": name, "version": version, "extensions": extensions})

    async def model_ready(self, request: web.Request) -> web.Response:
        """200 when that model version is ready; 400 when not, 404 for an unknown model."""
        mi = request.match_info
        if await self.engine.model_ready(mi["model"], mi.get("version", "")):
            return web.Response(status=200)
        return web.Response(body=error_body("Model version not ready"), status=400, content_type=JSON)

    async def model_metadata(self, request: web.Request) -> web.Response:
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

    async def model_config(self, request: web.Request) -> web.Response:
        """The normalized config as protobuf JSON with numeric int64 fields."""
        mi = request.match_info
        return json_response(to_json_dict(self.engine.model_config(mi["model"], mi.get("version", ""))))

    async def statistics(self, request: web.Request) -> web.Response:
        """Statistics JSON with every count/ns key present."""
        mi = request.match_info
        rows = self.engine.statistics(mi.get("model", ""), mi.get("version", ""))
        return json_response({"model_stats": [http_admin.stats_json(n, v, s) for n, v, s in rows]})

    # ---- inference ------------------------------------------------------------------------------------------
    async def infer(self, request: web.Request) -> web.Response:
        """POST .../infer: JSON and/or binary tensors in, JSON and/or binary tensors out."""
        mi = request.match_info
        model, version = mi["model"], mi.get("version", "")
        tracing = self.engine.tracer.enabled
        received = time.monotonic_ns() if tracing else 0
        body = await read_body(request, self.options.max_input_size)
        req, choice = self._decode(request, body, model, version)
        trace = self.engine.tracer.sample(model, request.headers.get("traceparent", "")) if tracing else None
        if trace is None:
            response = await self._run(req)
            payload, header_length = codec.encode_response(response, choice)
        else:
            trace.stamp("HTTP_RECV_START", received)
            trace.stamp("HTTP_RECV_END")
            req.trace = trace
            try:
                response = await self._run(req)
                trace.stamp("HTTP_SEND_START")
                payload, header_length = codec.encode_response(response, choice)
                trace.stamp("HTTP_SEND_END")
            finally:
                trace.finish()
        if header_length < 0:
            out = web.Response(body=payload, content_type=JSON)
        else:
            out = web.Response(
                body=payload,
                content_type="application/octet-stream",
                headers={codec.INFER_HEADER: str(header_length)},
            )
        return compress_if_asked(request, out)

    def _decode(
        self, request: web.Request, body: bytes, model: str, version: str
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

    async def _run(self, req: InferRequest) -> InferResponse:
        try:
            response = await self.engine.infer(req)
        except ServiceError as e:
            if e.code == ErrorCode.UNSUPPORTED and self.engine.is_decoupled(req.model_name, req.model_version):
                raise ServiceError(
                    ErrorCode.UNSUPPORTED, "HTTP end point doesn't support models with decoupled transaction policy"
                ) from None
            raise
        if response.error is not None:
            raise response.error
        return response
