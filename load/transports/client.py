"""Thin synchronous gRPC client for the inference protocol (our `protos`), with raw-bytes infer paths.

The load generator pre-serializes every ModelInferRequest once and sends bytes through identity
serializers, so the hot path does no protobuf work on the request side. Control RPCs (metadata,
config, statistics, shared-memory registration) go through the generated stub and raise `ClientError`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import grpc

from protos import grpc_service_pb2 as pb
from protos import grpc_service_pb2_grpc as pb_grpc

MAX_MESSAGE = 2**31 - 1
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
    # Each client process gets its own TCP connection(s), as separate perf_analyzer contexts would.
    ("grpc.use_local_subchannel_pool", 1),
]
_SERVICE = "/inference.GRPCInferenceService/"


class ClientError(Exception):
    """An RPC failed: `code` is the gRPC status name (e.g. "NOT_FOUND"), `message` the server's text."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def from_rpc(cls, err: grpc.RpcError) -> ClientError:
        """Build from a grpc.RpcError (which is also a grpc.Call for unary failures)."""
        code = err.code() if hasattr(err, "code") else None
        details = err.details() if hasattr(err, "details") else str(err)
        return cls(code.name if code is not None else "UNKNOWN", str(details or ""))


def _identity(data: bytes) -> bytes:
    return data


@dataclass(frozen=True)
class InputTensor:
    """One request input: raw bytes inline, or a (region, offset, byte_size) shared-memory reference."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: bytes | None = None
    shm_region: str | None = None
    shm_offset: int = 0
    shm_byte_size: int = 0


@dataclass(frozen=True)
class RequestedOutput:
    """One requested output, optionally placed in a shared-memory region."""

    name: str
    shm_region: str | None = None
    shm_byte_size: int = 0


def build_infer_request(
    model_name: str,
    model_version: str,
    inputs: Sequence[InputTensor],
    outputs: Sequence[RequestedOutput] = (),
    parameters: Mapping[str, bool | int | str] | None = None,
) -> pb.ModelInferRequest:
    """A ModelInferRequest with raw_input_contents for inline inputs and shm parameters for the rest."""
    req = pb.ModelInferRequest(model_name=model_name, model_version=model_version)
    for t in inputs:
        tensor = req.inputs.add(name=t.name, datatype=t.datatype, shape=list(t.shape))
        if t.shm_region is not None:
            tensor.parameters["shared_memory_region"].string_param = t.shm_region
            tensor.parameters["shared_memory_byte_size"].int64_param = t.shm_byte_size
            if t.shm_offset:
                tensor.parameters["shared_memory_offset"].int64_param = t.shm_offset
        else:
            req.raw_input_contents.append(t.data or b"")
    for o in outputs:
        out = req.outputs.add(name=o.name)
        if o.shm_region is not None:
            out.parameters["shared_memory_region"].string_param = o.shm_region
            out.parameters["shared_memory_byte_size"].int64_param = o.shm_byte_size
    for key, value in (parameters or {}).items():
        _set_param(req.parameters[key], value)
    return req


def _set_param(param: pb.InferParameter, value: bool | int | str) -> None:
    if isinstance(value, bool):
        param.bool_param = value
    elif isinstance(value, int):
        param.int64_param = value
    else:
        param.string_param = value


def request_suffix(
    request_id: str = "",
    sequence_id: int = 0,
    sequence_start: bool = False,
    sequence_end: bool = False,
) -> bytes:
    """Serialized fields to append to a pre-serialized ModelInferRequest.

    Protobuf merges concatenated messages (scalars: last wins, maps: entries added), so
    `body + request_suffix(...)` sets the id and sequence parameters without re-serializing tensors.
    """
    req = pb.ModelInferRequest(id=request_id)
    if sequence_id:
        req.parameters["sequence_id"].int64_param = sequence_id
        req.parameters["sequence_start"].bool_param = sequence_start
        req.parameters["sequence_end"].bool_param = sequence_end
    return req.SerializeToString()


class InferenceClient:
    """Synchronous client on one gRPC channel; control RPCs raise ClientError after `timeout_s`."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.channel = grpc.insecure_channel(url, options=CHANNEL_OPTIONS)
        self._stub = pb_grpc.GRPCInferenceServiceStub(self.channel)

    def __enter__(self) -> InferenceClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel (in-flight calls are cancelled)."""
        self.channel.close()

    def _call(self, method: Any, request: Any) -> Any:
        try:
            return method(request, timeout=self.timeout_s)
        except grpc.RpcError as err:
            raise ClientError.from_rpc(err) from None

    def server_live(self) -> bool:
        """ServerLive; raises ClientError(UNAVAILABLE) when nothing listens at the URL."""
        return bool(self._call(self._stub.ServerLive, pb.ServerLiveRequest()).live)

    def server_ready(self) -> bool:
        """ServerReady."""
        return bool(self._call(self._stub.ServerReady, pb.ServerReadyRequest()).ready)

    def server_metadata(self) -> pb.ServerMetadataResponse:
        """ServerMetadata (name, version, extensions)."""
        return self._call(self._stub.ServerMetadata, pb.ServerMetadataRequest())

    def model_metadata(self, name: str, version: str = "") -> pb.ModelMetadataResponse:
        """ModelMetadata for one model (inputs/outputs with -1 for variable and batch dims)."""
        return self._call(self._stub.ModelMetadata, pb.ModelMetadataRequest(name=name, version=version))

    def model_config(self, name: str, version: str = "") -> Any:
        """The server's normalized ModelConfig message."""
        resp = self._call(self._stub.ModelConfig, pb.ModelConfigRequest(name=name, version=version))
        return resp.config

    def model_statistics(self, name: str, version: str = "") -> pb.ModelStatisticsResponse:
        """ModelStatistics (cumulative counters since model load)."""
        return self._call(self._stub.ModelStatistics, pb.ModelStatisticsRequest(name=name, version=version))

    def register_system_shm(self, name: str, key: str, byte_size: int, offset: int = 0) -> None:
        """SystemSharedMemoryRegister for a POSIX region `key` (e.g. "/input0")."""
        req = pb.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=offset, byte_size=byte_size)
        self._call(self._stub.SystemSharedMemoryRegister, req)

    def unregister_system_shm(self, name: str = "") -> None:
        """SystemSharedMemoryUnregister; an empty name unregisters every system region."""
        self._call(self._stub.SystemSharedMemoryUnregister, pb.SystemSharedMemoryUnregisterRequest(name=name))

    def register_cuda_shm(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """CudaSharedMemoryRegister with a raw 64-byte cudaIpcMemHandle_t."""
        req = pb.CudaSharedMemoryRegisterRequest(
            name=name, raw_handle=raw_handle, device_id=device_id, byte_size=byte_size
        )
        self._call(self._stub.CudaSharedMemoryRegister, req)

    def unregister_cuda_shm(self, name: str = "") -> None:
        """CudaSharedMemoryUnregister; an empty name unregisters every CUDA region."""
        self._call(self._stub.CudaSharedMemoryUnregister, pb.CudaSharedMemoryUnregisterRequest(name=name))

    def raw_infer(self) -> grpc.UnaryUnaryMultiCallable:
        """ModelInfer taking serialized request bytes and returning serialized response bytes."""
        return self.channel.unary_unary(
            _SERVICE + "ModelInfer", request_serializer=_identity, response_deserializer=_identity
        )

    def raw_stream(self) -> grpc.StreamStreamMultiCallable:
        """ModelStreamInfer over serialized bytes in both directions."""
        return self.channel.stream_stream(
            _SERVICE + "ModelStreamInfer", request_serializer=_identity, response_deserializer=_identity
        )


def iter_queue(get: Any, sentinel: object = None) -> Iterator[bytes]:
    """Request iterator for a stream: yields items from `get()` until `sentinel`."""
    while True:
        item = get()
        if item is sentinel:
            return
        yield item
