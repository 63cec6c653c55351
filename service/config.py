"""ServerConfig: the only reader of the command line (Triton's flag names) and environment."""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass, field

log = logging.getLogger("trireme.config")

EXAMPLE_REPOSITORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "example_models")
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_bool(text: str) -> bool:
    """Triton-style boolean flag value."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got '{text}'")


@dataclass(slots=True)
class ServerConfig:
    """Everything the server needs to start."""

    model_repositories: list[str] = field(default_factory=list)
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    auto_complete: bool = True
    model_control_mode: str = "none"
    load_models: list[str] = field(default_factory=list)
    exit_on_error: bool = True
    strict_readiness: bool = True
    log_verbose: int = 0
    exit_timeout_secs: int = 30
    server_id: str = "triton"
    allow_client_shm: bool = True
    model_config_name: str = ""
    arena_bytes: int = 256 << 20
    using_example_repository: bool = False


def build_parser() -> argparse.ArgumentParser:
    """Flags with Triton's names; `--flag=value` and `--flag value` both work."""
    p = argparse.ArgumentParser(prog="trireme", description="Trireme: a Triton-compatible inference server.")
    p.add_argument("--model-repository", "--model-store", action="append", default=[], dest="model_repository")
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--grpc-address", default="0.0.0.0")
    p.add_argument("--strict-model-config", type=parse_bool, default=None)
    p.add_argument("--disable-auto-complete-config", action="store_true")
    p.add_argument("--model-control-mode", choices=["none", "poll", "explicit"], default="none")
    p.add_argument("--load-model", action="append", default=[])
    p.add_argument("--exit-on-error", type=parse_bool, default=True)
    p.add_argument("--strict-readiness", type=parse_bool, default=True)
    p.add_argument("--log-verbose", type=int, default=0)
    p.add_argument("--exit-timeout-secs", type=int, default=30)
    p.add_argument("--id", default="triton")
    p.add_argument("--allow-client-shm", type=parse_bool, default=True)
    p.add_argument("--model-config-name", default="")
    p.add_argument(
        "--backend-config",
        action="append",
        default=[],
        help="backend,key=value; python,shm-default-byte-size=N sets each worker's arena size",
    )
    return p


def parse_args(argv: list[str]) -> ServerConfig:
    """ServerConfig from argv (without the program name); unknown Triton flags only warn."""
    if argv and argv[0] == "serve":
        argv = argv[1:]
    args, unknown = build_parser().parse_known_args(argv)
    for flag in unknown:
        log.warning("ignoring unsupported option '%s'", flag)
    config = ServerConfig(
        model_repositories=list(args.model_repository),
        grpc_address=args.grpc_address,
        grpc_port=args.grpc_port,
        model_control_mode=args.model_control_mode,
        load_models=list(args.load_model),
        exit_on_error=args.exit_on_error,
        strict_readiness=args.strict_readiness,
        log_verbose=args.log_verbose,
        exit_timeout_secs=args.exit_timeout_secs,
        server_id=args.id,
        allow_client_shm=args.allow_client_shm,
        model_config_name=args.model_config_name,
    )
    if args.disable_auto_complete_config or args.strict_model_config is True:
        config.auto_complete = False
    for entry in args.backend_config:
        backend, _, setting = entry.partition(",")
        key, _, value = setting.partition("=")
        if backend == "python" and key == "shm-default-byte-size" and value.isdigit():
            config.arena_bytes = max(1 << 20, int(value))
    if not config.model_repositories:
        config.model_repositories = [EXAMPLE_REPOSITORY]
        config.using_example_repository = True
    return config
