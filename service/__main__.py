"""CLI entry point: `trireme serve --model-repository DIR ...` (also `python -m service ...`)."""

from __future__ import annotations

import logging
import os
import sys

# glibc returns every >128 KiB allocation to the OS at once, so each MiB-sized protobuf field costs page faults
# on every request (measured: ~2x slower at 1 MiB tensors). Large messages too: grpc copies each received
# message into one bytes object and each response into its send buffer on the event-loop thread with the GIL
# held, and into fresh pages a 100 MiB copy takes ~40 ms of page faults instead of ~5 ms (every other client
# waits meanwhile). Buffers up to 512 MiB therefore come from the heap and stay mapped when freed (up to the
# trim threshold), unless the user set the variables. docs/benchmarks.md "Large messages" has the numbers.
MALLOC_DEFAULTS = {"MALLOC_MMAP_THRESHOLD_": "536870912", "MALLOC_TRIM_THRESHOLD_": "536870912"}


def _reexec_with_malloc_tuning() -> None:
    if os.environ.get("TRIREME_NO_MALLOC_TUNING") or all(k in os.environ for k in MALLOC_DEFAULTS):
        return
    env = dict(os.environ)
    for k, v in MALLOC_DEFAULTS.items():
        env.setdefault(k, v)
    os.execve(sys.executable, [sys.executable, "-m", "service", *sys.argv[1:]], env)


def main() -> None:
    """Parse flags and run the server until SIGINT/SIGTERM."""
    _reexec_with_malloc_tuning()
    # Workers are started with fork+exec while gRPC threads run. gRPC's fork handlers (for children that go on
    # using gRPC, which workers never do) then crash some children between fork and exec (SIGSEGV): off.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    from service.config.flags import parse_args
    from service.server import run

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = parse_args(sys.argv[1:])
    if config.log_file or config.log_format:
        from service.core.observability.log_output import configure

        try:
            configure(config.log_file, config.log_format or "default")
        except OSError as e:
            sys.exit(f"error: --log-file: cannot open '{config.log_file}': {e.strerror}")
    if config.log_verbose:
        logging.getLogger().setLevel(logging.DEBUG)
    sys.exit(run(config))


if __name__ == "__main__":
    main()
