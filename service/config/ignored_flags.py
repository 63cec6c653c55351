"""Triton flags that Trireme accepts with one warning each and otherwise ignores (--help and docs/flags.md)."""

from __future__ import annotations

import argparse

# Triton flags that Trireme accepts and ignores, with Triton's meaning (shown by --help). Implementing one for
# real? Add it to build_parser and delete its entry here (a real flag of the same name already wins).
IGNORED_TRITON_FLAGS: dict[str, str] = {
    "--allow-grpc": "serve the gRPC endpoint (Trireme always does)",
    "--reuse-grpc-port": "let several servers share the gRPC port",
    "--grpc-header-forward-pattern": "gRPC headers forwarded to backends as request parameters",
    "--grpc-infer-allocation-pool-size": "gRPC inference request objects kept for reuse",
    "--grpc-infer-response-compression-level": "compression of gRPC inference responses",
    "--allow-sagemaker": "serve the SageMaker endpoint",
    "--sagemaker-port": "port of the SageMaker endpoint",
    "--sagemaker-safe-port-range": "port range of SageMaker multi-model mode",
    "--sagemaker-thread-count": "threads of the SageMaker endpoint",
    "--allow-vertex-ai": "serve the Vertex AI endpoint",
    "--vertex-ai-port": "port of the Vertex AI endpoint",
    "--vertex-ai-thread-count": "threads of the Vertex AI endpoint",
    "--vertex-ai-default-model": "model that Vertex AI requests go to",
    "--model-load-thread-count": "threads that load models",
    "--model-load-retry-count": "retries of a failed model load",
    "--model-namespacing": "models of the same name in different repositories",
    "--model-load-gpu-limit": "GPU memory share at which model loading stops",
    "--enable-peer-access": "CUDA peer access between GPUs",
    "--pinned-memory-pool-byte-size": "size of the pinned host memory pool",
    "--cuda-memory-pool-byte-size": "size of a GPU's CUDA memory pool (gpu:bytes)",
    "--cuda-virtual-address-size": "CUDA virtual address space per GPU",
    "--min-supported-compute-capability": "oldest CUDA compute capability used",
    "--buffer-manager-thread-count": "threads that copy input/output buffers",
    "--cache-directory": "directory of cache implementations",
    "--repoagent-directory": "directory of repository agents",
    "--log-info": "log INFO messages (Trireme: always on)",
    "--log-warning": "log WARNING messages (Trireme: always on)",
    "--log-error": "log ERROR messages (Trireme: always on)",
    "--log-format": "log line format (default, ISO8601)",
    "--log-file": "file the log is written to",
}


def add_ignored_flags(p: argparse.ArgumentParser) -> None:
    """Register the ignored Triton flags that no real flag has taken (a real flag always wins)."""
    group = p.add_argument_group("accepted but ignored Triton flags")
    for flag, meaning in IGNORED_TRITON_FLAGS.items():
        if flag in p._option_string_actions:  # another engineer made it a real flag: theirs wins
            continue
        group.add_argument(
            flag,
            action=_Ignored,
            nargs="?",
            metavar="VALUE",
            help=f"Triton: {meaning}; accepted and ignored",
        )


class _Ignored(argparse.Action):
    """Records `--flag value` / `--flag=value` / bare `--flag` so parse_args can warn once per flag."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        ignored = list(getattr(namespace, "ignored_flags", None) or [])
        ignored.append(f"{option_string}={values}" if values is not None else str(option_string))
        namespace.ignored_flags = ignored
