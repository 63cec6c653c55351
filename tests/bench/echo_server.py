"""The transport floor: a bare grpc.aio + uvloop KServe v2 server that echoes INPUT0 as OUTPUT0.

No core, no scheduler, no worker: it parses each ModelInferRequest and builds the ModelInferResponse with the
same generated protobuf classes and server options as Trireme's front end. Whatever Trireme's server spends per
request above this is ours. Serves just enough of GRPCInferenceService for perf_analyzer and tritonclient
(ServerLive/Ready, ModelReady, ModelMetadata, ModelConfig, ModelStatistics, ModelInfer) for one unbatched FP32
`[-1]` identity model of any name.

Methods are registered the way Trireme's front end registers them (a generic handler only); --registered also
registers them as grpc "registered methods", as the generated add_*_to_server function does (the floor before
Trireme dropped that: ~115k instructions more per call, see docs/benchmarks.md).

--transport native serves the same handlers on pygrpc-native's aio server (HTTP/2 and gRPC framing in Rust; the
methods registered as registered methods, which is how it serves them in Rust, as Trireme's `--grpc-transport
native` does). ModelStatistics reports the ModelInfer calls answered (inference_count), so that benches can count
requests the way they count Trireme's. tests/bench/h2_echo_server.py serves the same handlers on HTTP/2 stacks of
its own.

Usage: python tests/bench/echo_server.py --port PORT [--registered] [--transport grpcio|native]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import grpc
import uvloop

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from protos import grpc_service_pb2 as pb  # noqa: E402
from protos import grpc_service_pb2_grpc as pb_grpc  # noqa: E402
from protos import model_config_pb2 as mc  # noqa: E402

OPTIONS = [
    ("grpc.max_receive_message_length", 2**31 - 1),
    ("grpc.max_send_message_length", 2**31 - 1),
    ("grpc.so_reuseport", 0),
]


class Echo(pb_grpc.GRPCInferenceServiceServicer):
    """The identity model's RPCs, answered directly on the event loop."""

    count = 0  # ModelInfer calls answered

    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=True)

    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="triton", version="echo")

    async def ModelReady(self, request: Any, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=True)

    async def ModelMetadata(self, request: Any, context: Any) -> pb.ModelMetadataResponse:
        msg = pb.ModelMetadataResponse(name=request.name, versions=["1"], platform="python")
        msg.inputs.add(name="INPUT0", datatype="FP32", shape=[-1])
        msg.outputs.add(name="OUTPUT0", datatype="FP32", shape=[-1])
        return msg

    async def ModelConfig(self, request: Any, context: Any) -> pb.ModelConfigResponse:
        config = mc.ModelConfig(name=request.name, backend="python", max_batch_size=0)
        config.input.add(name="INPUT0", data_type=mc.TYPE_FP32, dims=[-1])
        config.output.add(name="OUTPUT0", data_type=mc.TYPE_FP32, dims=[-1])
        return pb.ModelConfigResponse(config=config)

    async def ModelStatistics(self, request: Any, context: Any) -> pb.ModelStatisticsResponse:
        msg = pb.ModelStatisticsResponse()
        msg.model_stats.add(name=request.name, version="1", inference_count=self.count, execution_count=self.count)
        return msg

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        msg = pb.ModelInferResponse(model_name=request.model_name, model_version="1", id=request.id)
        t = request.inputs[0]
        msg.outputs.add(name="OUTPUT0", datatype=t.datatype, shape=t.shape)
        msg.raw_output_contents.append(request.raw_input_contents[0])
        self.count += 1
        return msg


class _Captured:
    """Stands in for the server while the generated add_*_to_server function registers the servicer."""

    generic: Any = ()
    registered: tuple[str, Any] = ("", {})

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.generic = handlers

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        self.registered = (service, handlers)


async def serve(port: int, registered: bool, transport: str = "grpcio") -> None:
    """Serve until killed; `registered`: also as grpc "registered methods" (what the generated code does;
    Trireme's front end registers only the generic handler, see service/frontend/grpc/transport.add_service).
    transport "native": pygrpc-native's server, registered methods only."""
    if transport == "native":
        import pygrpc_native.aio  # not `from pygrpc_native import aio` (0.5.0's lazy __getattr__ recurses)

        server = pygrpc_native.aio.server(options=OPTIONS)
        captured = _Captured()
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(Echo(), captured)
        server.add_registered_method_handlers(*captured.registered)
    elif registered:
        server = grpc.aio.server(options=OPTIONS)
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(Echo(), server)
    else:
        server = grpc.aio.server(options=OPTIONS)
        captured = _Captured()
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(Echo(), captured)
        server.add_generic_rpc_handlers(captured.generic)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("Started GRPCInferenceService (echo)", flush=True)
    await server.wait_for_termination()


def main() -> None:
    """Parse --port and run on uvloop."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--registered", action="store_true", help="also register the methods as registered methods")
    ap.add_argument("--transport", choices=("grpcio", "native"), default="grpcio")
    args = ap.parse_args()
    uvloop.run(serve(args.port, args.registered, args.transport))


if __name__ == "__main__":
    main()
