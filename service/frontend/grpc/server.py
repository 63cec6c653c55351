"""The gRPC front end: GRPCInferenceService and grpc.health.v1 on grpc.aio, translating to Engine calls."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, NoReturn, TypeVar

import grpc

from protos import grpc_service_pb2 as pb
from protos import grpc_service_pb2_grpc as pb_grpc
from protos import health_pb2, health_pb2_grpc
from service.config.access import GrpcSettings
from service.core.facade import Facade
from service.errors import ErrorCode, ServiceError
from service.frontend.grpc import codec
from service.frontend.grpc import large as grpc_large
from service.frontend.grpc import stream as grpc_stream
from service.frontend.grpc import wire as grpc_wire
from service.frontend.grpc.calls import CallOptions, compression_option
from service.frontend.grpc.codec import UNPARSABLE
from service.frontend.grpc.handlers import (
    HEALTH_SERVICE,
    INFERENCE_SERVICE,
    HandlerFactory,
    checks_unparsable,
    health_handlers,
    inference_handlers,
)
from service.frontend.grpc.observers import NO_OBSERVERS, infer_observers
from service.frontend.grpc.transport import H2, add_service, adopt_sockets, make_server
from service.frontend.status import GRPC_STATUS
from service.ipc import stagetrace
from shm.errors import ShmError

log = logging.getLogger("trireme.grpc")
_T = TypeVar("_T")

MAX_MESSAGE = 2**31 - 1
SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.so_reuseport", 0),
]


async def _abort(context: grpc.aio.ServicerContext, e: Exception) -> NoReturn:
    err = codec.error_to_service(e)
    if err.code == ErrorCode.INTERNAL and not isinstance(e, ServiceError):
        log.exception("internal error")
    await context.abort(GRPC_STATUS[err.code], err.message)
    raise AssertionError("unreachable")


class aborting:
    """`async with aborting(context):` the one try/except of the unary RPCs: an exception raised in the block
    aborts the call with its gRPC status and message (as _abort maps it); an abort already under way passes."""

    __slots__ = ("context",)

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self.context = context

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, kind: type[BaseException] | None, e: BaseException | None, tb: Any) -> None:
        if isinstance(e, Exception) and not isinstance(e, grpc.aio.AbortError):
            await _abort(self.context, e)


def _shm_to_service(e: ShmError) -> ServiceError:
    return ServiceError(ErrorCode[e.code], e.message)


async def _shm_call(
    context: grpc.aio.ServicerContext,
    call: Callable[[], _T],
    others: type[Exception] | tuple[type[Exception], ...] = Exception,
) -> _T:
    """call() for a shared-memory RPC: a ShmError aborts with its own code and message, an exception of `others`
    (every exception by default; the status RPCs pass none) aborts as _abort maps it."""
    try:
        return call()
    except ShmError as e:
        await _abort(context, _shm_to_service(e))
    except others as e:
        await _abort(context, e)


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """Every RPC of inference.GRPCInferenceService."""

    def __init__(self, engine: Facade, handlers: HandlerFactory, stream_buffer_bytes: int = 64 << 20) -> None:
        self.engine = engine
        self.handlers = handlers
        self.stream_buffer_bytes = stream_buffer_bytes
        self.calls: CallOptions | None = None  # header forwarding / response compression (grpc/calls.py)

    # ---- health & metadata --------------------------------------------------------------------------------
    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.engine.live)

    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.engine.server_ready())

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        async with aborting(context):
            return pb.ModelReadyResponse(ready=await self.engine.model_ready(request.name, request.version))

    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        name, version, extensions = self.engine.server_metadata()
        return pb.ServerMetadataResponse(name=name, version=version, extensions=extensions)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        async with aborting(context):
            return codec.metadata_response(self.engine.model_metadata(request.name, request.version))

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        async with aborting(context):
            response = pb.ModelConfigResponse()
            response.config.CopyFrom(self.engine.model_config(request.name, request.version))
            return response

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Any) -> pb.ModelStatisticsResponse:
        async with aborting(context):
            return codec.statistics_response(self.engine.statistics(request.name, request.version))

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        if request.repository_name:
            await _abort(
                context,
                ServiceError(ErrorCode.UNSUPPORTED, "'repository_name' specification is not supported"),
            )
        return codec.index_response(self.engine.repository_index(request.ready))

    # ---- inference ------------------------------------------------------------------------------------------
    @checks_unparsable
    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        if request is UNPARSABLE:
            await self.handlers.reject_unparsable(context)
        # one path; tracing and stage timestamps watch it (observers.py), none on the common untraced call
        engine = self.engine
        observers = (
            NO_OBSERVERS
            if stagetrace.RECORDER is None and not engine.tracer.enabled and self.calls is None
            else infer_observers(engine, context, self.calls)
        )
        try:
            try:  # a plain try here: this is the hot path (see `aborting` for the other RPCs)
                req = codec.decode_infer_request(request)
                for o in observers:
                    o.decoded(req)
                response = await engine.infer(req)
            except Exception as e:
                await _abort(context, e)
            for o in observers:
                o.resumed()
            if response.error is not None:
                await _abort(context, response.error)
            for o in observers:
                o.encoding()
            encoded: pb.ModelInferResponse | bytes
            if grpc_large.response_bytes(response) >= grpc_large.LARGE_BYTES:
                encoded = await grpc_large.serialize_large(response)  # bytes, see grpc_large.serialize
            else:  # the usual response as bytes written here; protobuf for the rest
                plain = grpc_wire.encode_plain_response(response)
                encoded = plain if plain is not None else codec.encode_infer_response(response)
            for o in observers:
                o.encoded()
            return encoded  # type: ignore[return-value]
        finally:
            for o in observers:
                o.finished()

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any) -> None:
        # reads with context.read(), writes with write()
        await grpc_stream.serve_stream(
            self.engine, context, self.stream_buffer_bytes, self.handlers.note_unparsable, self.calls
        )

    # ---- model control -------------------------------------------------------------------------------------
    async def RepositoryModelLoad(self, request: Any, context: Any) -> pb.RepositoryModelLoadResponse:
        async with aborting(context):
            if request.repository_name:
                raise ServiceError(ErrorCode.UNSUPPORTED, "'repository_name' specification is not supported")
            config_json = ""
            files: dict[str, bytes] = {}
            for key, value in request.parameters.items():
                if key == "config":
                    if value.WhichOneof("parameter_choice") != "string_param":
                        raise ServiceError(ErrorCode.INVALID_ARG, "'config' parameter is expected to be a string")
                    config_json = value.string_param
                elif key.startswith("file:"):
                    if value.WhichOneof("parameter_choice") != "bytes_param":
                        raise ServiceError(
                            ErrorCode.INVALID_ARG,
                            f"invalid value type for load parameter '{key}', expected bytes_param.",
                        )
                    files[key] = value.bytes_param
                else:
                    raise ServiceError(ErrorCode.INVALID_ARG, f"unrecognized load parameter '{key}'.")
            await self.engine.load_model(request.model_name, config_json, files)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: Any, context: Any) -> pb.RepositoryModelUnloadResponse:
        async with aborting(context):
            if request.repository_name:
                raise ServiceError(ErrorCode.UNSUPPORTED, "'repository_name' specification is not supported")
            dependents = False
            for key, value in request.parameters.items():
                if key == "unload_dependents":
                    if value.WhichOneof("parameter_choice") != "bool_param":
                        raise ServiceError(
                            ErrorCode.INVALID_ARG,
                            "invalid value type for unload parameter 'unload_dependents', expected bool_param.",
                        )
                    dependents = value.bool_param
            await self.engine.unload_model(request.model_name, dependents)
        return pb.RepositoryModelUnloadResponse()

    # ---- shared memory --------------------------------------------------------------------------------------
    def _registry(self) -> Any:
        return self.engine.client_shm()

    def _shm_status(self, kind: str, name: str) -> list[Any]:
        """Regions of kind "system" or "cuda" (all when name is empty); none while client shm is disabled."""
        registry = self.engine.shm_registry
        if registry is None:
            if name:  # client shm disabled: nothing is registered
                raise ShmError("NOT_FOUND", f"Unable to find {kind} shared memory region: '{name}'")
            return []
        return registry.system_status(name) if kind == "system" else registry.cuda_status(name)

    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> pb.SystemSharedMemoryStatusResponse:
        regions = await _shm_call(context, lambda: self._shm_status("system", request.name), others=())
        response = pb.SystemSharedMemoryStatusResponse()
        for r in regions:
            response.regions[r.name].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size
                )
            )
        return response

    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> pb.SystemSharedMemoryRegisterResponse:
        await _shm_call(
            context,
            lambda: self._registry().register_system(request.name, request.key, request.offset, request.byte_size),
        )
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> pb.SystemSharedMemoryUnregisterResponse:
        await _shm_call(context, lambda: self._registry().unregister_system(request.name))
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> pb.CudaSharedMemoryStatusResponse:
        regions = await _shm_call(context, lambda: self._shm_status("cuda", request.name), others=())
        response = pb.CudaSharedMemoryStatusResponse()
        for r in regions:
            response.regions[r.name].CopyFrom(
                pb.CudaSharedMemoryStatusResponse.RegionStatus(
                    name=r.name, device_id=r.device_id, byte_size=r.byte_size
                )
            )
        return response

    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> pb.CudaSharedMemoryRegisterResponse:
        await _shm_call(
            context,
            lambda: self._registry().register_cuda(
                request.name, request.raw_handle, request.device_id, request.byte_size
            ),
        )
        return pb.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> pb.CudaSharedMemoryUnregisterResponse:
        await _shm_call(context, lambda: self._registry().unregister_cuda(request.name))
        return pb.CudaSharedMemoryUnregisterResponse()

    # ---- settings ------------------------------------------------------------------------------------------
    async def TraceSetting(self, request: pb.TraceSettingRequest, context: Any) -> pb.TraceSettingResponse:
        updates: dict[str, list[str] | None] = {k: list(v.value) for k, v in request.settings.items()}
        async with aborting(context):
            current = self.engine.trace_setting(request.model_name, updates)
        response = pb.TraceSettingResponse()
        for key, values in current.items():
            response.settings[key].value.extend(values)
        return response

    async def LogSettings(self, request: pb.LogSettingsRequest, context: Any) -> pb.LogSettingsResponse:
        changes = {}
        for key, value in request.settings.items():
            which = value.WhichOneof("parameter_choice")
            if which is not None:
                changes[key] = getattr(value, which)
        async with aborting(context):
            if changes:
                self.engine.log_settings.update(changes)
        response = pb.LogSettingsResponse()
        for key, current in self.engine.log_settings.as_dict().items():
            entry = response.settings[key]
            if isinstance(current, bool):
                entry.bool_param = current
            elif isinstance(current, int):
                entry.uint32_param = current
            else:
                entry.string_param = current
        return response


class HealthServicer(health_pb2_grpc.HealthServicer):
    """grpc.health.v1.Health: SERVING iff the server is ready."""

    def __init__(self, engine: Facade) -> None:
        self.engine = engine

    async def Check(self, request: Any, context: Any) -> health_pb2.HealthCheckResponse:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if self.engine.server_ready()
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        return health_pb2.HealthCheckResponse(status=status)


def _read_pem(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise OSError(f"unable to read the gRPC {what} '{path}': {e.strerror}") from None


def _tls_files(settings: GrpcSettings) -> tuple[bytes, bytes, bytes | None] | None:
    """(key, certificate, root or None) read from Triton's --grpc-*-cert flags; None: plaintext."""
    tls = settings.tls
    if not tls.use_ssl:
        return None
    cert_path, key_path, root_path = tls.files()
    key = _read_pem(key_path, "server key")
    cert = _read_pem(cert_path, "server certificate")
    root = _read_pem(root_path, "root certificate") if root_path else None
    return key, cert, root


def server_credentials(settings: GrpcSettings) -> grpc.ServerCredentials | None:
    """TLS credentials from Triton's --grpc-use-ssl* / --grpc-*-cert flags (None: plaintext)."""
    files = _tls_files(settings)
    if files is None:
        return None
    key, cert, root = files
    return grpc.ssl_server_credentials([(key, cert)], root, require_client_auth=settings.tls.use_ssl_mutual)


def _h2_tls(settings: GrpcSettings) -> Any:
    """The h2 transport's TLS: an ssl.SSLContext from the same flags (None: plaintext)."""
    from service.frontend.grpc.h2.server import ssl_context

    files = _tls_files(settings)
    return None if files is None else ssl_context(*files, settings.tls.use_ssl_mutual)


def build_grpc_server(
    engine: Facade,
    address: str,
    settings: GrpcSettings | None = None,
    reuse_port: bool = False,
    listening: Sequence[socket.socket] = (),
) -> tuple[grpc.aio.Server, int]:
    """A grpc.aio server bound to `address` (host:port; port 0 picks one). Returns (server, bound port).
    `reuse_port`: share the port with the other front-end processes (SO_REUSEPORT). `listening` (h2 only): serve
    these sockets, shared with the other front-end processes, instead of binding `address`."""
    settings = settings or GrpcSettings()
    credentials = _h2_tls(settings) if settings.transport == H2 else server_credentials(settings)
    reuse_port = reuse_port or settings.reuse_port  # front-end processes, or --reuse-grpc-port
    options = [(k, 1 if reuse_port and k == "grpc.so_reuseport" else v) for k, v in SERVER_OPTIONS]
    options += settings.channel_args.items()
    options += compression_option(settings.infer_compression_level)
    server = make_server(settings.transport, options)
    factory = HandlerFactory(settings.restricted)
    servicer = InferenceServicer(engine, factory, settings.stream_buffer_bytes)
    servicer.calls = CallOptions.of(settings)
    add_service(server, settings.transport, INFERENCE_SERVICE, inference_handlers(servicer, factory))
    add_service(server, settings.transport, HEALTH_SERVICE, health_handlers(HealthServicer(engine), factory))
    try:
        if listening:
            port = adopt_sockets(server, settings.transport, listening, credentials)
        elif credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    except RuntimeError:
        port = 0
    if port == 0:
        raise OSError(f"unable to bind the gRPC server to {address} (address already in use?)")
    return server, port
