"""The SageMaker and Vertex AI endpoints' flags and environment (Triton's names; docs/sagemaker.md,
docs/vertex_ai.md), and Triton's check that no two endpoints share a port or leave SageMaker's safe range."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from service.config.values import parse_bool

SAGEMAKER_MODELS_ROOT = "/opt/ml/models"  # where SageMaker puts multi-model archives (Triton's path regex)
INFERENCE_TYPES = ("infer", "generate", "generate_stream")


@dataclass(slots=True)
class SageMakerOptions:
    """--allow-sagemaker and friends, plus the SAGEMAKER_TRITON_* environment Triton reads."""

    enabled: bool = False
    address: str = "0.0.0.0"
    port: int = 8080
    safe_range: tuple[int, int] | None = None  # --sagemaker-safe-port-range: where the other endpoints must be
    default_model: str = ""  # SAGEMAKER_TRITON_DEFAULT_MODEL_NAME ("": the only model served)
    ping_mode: str = "ready"  # SAGEMAKER_TRITON_PING_MODE: ready | live
    inference_type: str = "infer"  # SAGEMAKER_TRITON_INFERENCE_TYPE: infer | generate | generate_stream
    models_root: str = SAGEMAKER_MODELS_ROOT  # TRIREME_SAGEMAKER_MODELS_ROOT: a test may move it


@dataclass(slots=True)
class VertexAiOptions:
    """--allow-vertex-ai and friends, plus the AIP_* environment Vertex AI sets."""

    enabled: bool = False
    address: str = "0.0.0.0"
    port: int = 8080  # AIP_HTTP_PORT when set
    default_model: str = ""  # --vertex-ai-default-model ("": the only model loaded)
    predict_route: str = ""  # AIP_PREDICT_ROUTE
    health_route: str = ""  # AIP_HEALTH_ROUTE


def _port_range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition("-")
    try:
        if not sep:
            raise ValueError
        return int(low), int(high)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected <integer>-<integer>, got '{text}'") from None


def add_cloud_flags(p: argparse.ArgumentParser) -> None:
    """Triton's Sagemaker and Vertex option groups (thread counts are accepted: one event loop serves)."""
    g = p.add_argument_group("SageMaker and Vertex AI endpoints")
    g.add_argument(
        "--allow-sagemaker", type=parse_bool, default=False, metavar="BOOL", help="serve the SageMaker API (false)"
    )
    g.add_argument("--sagemaker-port", type=int, default=8080, metavar="PORT", help="SageMaker API port (8080)")
    g.add_argument(
        "--sagemaker-safe-port-range",
        type=_port_range,
        default=None,
        metavar="LOW-HIGH",
        help="the ports the other endpoints must use when SageMaker is served (any)",
    )
    g.add_argument(
        "--sagemaker-thread-count", type=int, default=8, metavar="N", help="accepted; one event loop serves (8)"
    )
    g.add_argument(
        "--allow-vertex-ai",
        type=parse_bool,
        default=None,
        metavar="BOOL",
        help="serve the Vertex AI API (true when AIP_MODE=PREDICTION, else false)",
    )
    g.add_argument(
        "--vertex-ai-port", type=int, default=None, metavar="PORT", help="Vertex AI API port (AIP_HTTP_PORT or 8080)"
    )
    g.add_argument(
        "--vertex-ai-thread-count", type=int, default=8, metavar="N", help="accepted; one event loop serves (8)"
    )
    g.add_argument(
        "--vertex-ai-default-model",
        default="",
        metavar="NAME",
        help="the model the prediction route infers (the only model loaded when not given)",
    )


def vertex_environment() -> bool:
    """AIP_MODE=PREDICTION: Vertex AI runs this container (Vertex on, HTTP off unless the flags say otherwise)."""
    return os.environ.get("AIP_MODE", "") == "PREDICTION"


def cloud_options(args: argparse.Namespace, address: str) -> tuple[SageMakerOptions, VertexAiOptions]:
    """Both endpoints' options from the flags and the environment; raises ValueError for a bad environment."""
    env = os.environ
    inference_type = env.get("SAGEMAKER_TRITON_INFERENCE_TYPE", "infer")
    sagemaker = SageMakerOptions(
        enabled=args.allow_sagemaker,
        address=address,
        port=args.sagemaker_port,
        safe_range=args.sagemaker_safe_port_range,
        default_model=env.get("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME", ""),
        ping_mode=env.get("SAGEMAKER_TRITON_PING_MODE", "ready"),
        inference_type=inference_type,
        models_root=env.get("TRIREME_SAGEMAKER_MODELS_ROOT", SAGEMAKER_MODELS_ROOT),
    )
    if sagemaker.enabled and inference_type not in INFERENCE_TYPES:
        raise ValueError(
            f"Invalid SAGEMAKER_TRITON_INFERENCE_TYPE '{inference_type}': must be one of: infer, generate, "
            "generate_stream"
        )
    port = args.vertex_ai_port
    if port is None:
        port = int(env.get("AIP_HTTP_PORT", "8080"))
    vertex = VertexAiOptions(
        enabled=args.allow_vertex_ai if args.allow_vertex_ai is not None else vertex_environment(),
        address=address,
        port=port,
        default_model=args.vertex_ai_default_model,
        predict_route=env.get("AIP_PREDICT_ROUTE", ""),
        health_route=env.get("AIP_HEALTH_ROUTE", ""),
    )
    return sagemaker, vertex


def check_ports(endpoints: list[tuple[str, str, int]], sagemaker: SageMakerOptions) -> None:
    """Triton's start-up check over (service, address, port): no two endpoints on one address and port, and
    with --sagemaker-safe-port-range every other endpoint on SageMaker's address inside the range. Port 0 (any
    free port) is never a clash. Raises ValueError with Triton's message."""
    if sagemaker.enabled:
        endpoints = [*endpoints, ("SageMaker", sagemaker.address, sagemaker.port)]
        if sagemaker.safe_range is not None:
            low, high = sagemaker.safe_range
            for name, address, port in endpoints[:-1]:
                if address == sagemaker.address and not low <= port <= high:
                    raise ValueError(
                        f"The server cannot listen to {name} requests at port {port}, allowed port range is "
                        f"[{low}, {high}]"
                    )
    for i, (name, address, port) in enumerate(endpoints):
        for other, other_address, other_port in endpoints[i + 1 :]:
            if port and address == other_address and port == other_port:
                raise ValueError(
                    f"The server cannot listen to {name} requests and {other} requests at the same address and "
                    f"port {address}:{port}"
                )
