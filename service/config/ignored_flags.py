"""Triton flags that Trireme accepts with one warning each and otherwise ignores (--help and docs/flags.md)."""

from __future__ import annotations

import argparse

# Triton flags that Trireme accepts and ignores, with Triton's meaning (shown by --help). Implementing one for
# real? Add it to build_parser and delete its entry here (a real flag of the same name already wins).
IGNORED_TRITON_FLAGS: dict[str, str] = {
    "--allow-grpc": "serve the gRPC endpoint (Trireme always does)",
    "--grpc-infer-allocation-pool-size": "gRPC inference request objects kept for reuse",
    "--model-load-gpu-limit": "GPU memory share at which model loading stops",
    "--enable-peer-access": "CUDA peer access between GPUs",
    "--pinned-memory-pool-byte-size": "size of the pinned host memory pool",
    "--cuda-memory-pool-byte-size": "size of a GPU's CUDA memory pool (gpu:bytes)",
    "--cuda-virtual-address-size": "CUDA virtual address space per GPU",
    "--min-supported-compute-capability": "oldest CUDA compute capability used",
    "--buffer-manager-thread-count": "threads that copy input/output buffers",
    "--cache-directory": "directory of cache implementations",
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
