"""Run every reliability probe against Trireme or real Triton 2.51 and print one line per probe and the summary.

    python -m tests.reliability.run --server trireme [--full]
    python -m tests.reliability.run --server triton --full     # needs the anchors (tritonserver)

--full (or TRIREME_RELIABILITY=full) runs the full length: >= 1000 fuzz cases, a one-minute soak."""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from pathlib import Path


def main() -> int:
    """Start the server, run the probes, print the lines; exit status 1 when a probe is not clean."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", choices=["trireme", "triton"], default="trireme")
    parser.add_argument("--full", action="store_true", help="full length (TRIREME_RELIABILITY=full)")
    args = parser.parse_args()
    if args.full:
        os.environ["TRIREME_RELIABILITY"] = "full"
    # imported after the environment is set: the length is read at import
    from tests.reliability import fuzz, hostile, probes
    from tests.reliability.servers import build_repo, start, stop
    from tests.reliability.tally import FULL, Tally, scaled

    tmp = Path(tempfile.mkdtemp(prefix="reliability-"))
    repo = build_repo(tmp / "repo")
    target = start(args.server, repo, tmp / "server.log")
    total = Tally()

    def report(name: str, tally: Tally, extra: str = "") -> None:
        total.add(tally)
        print(f"{tally.line(name)}{extra}  statuses {dict(tally.statuses)}", flush=True)

    try:
        report("fuzz ModelInfer", fuzz.fuzz_infer(target, 20, scaled(60, 600)))
        report("fuzz ModelStreamInfer", fuzz.fuzz_stream(target, 21, scaled(50, 300)))
        report("fuzz shared memory", fuzz.fuzz_shm(target, 22, scaled(30, 200)))
        report("fuzz HTTP bodies", fuzz.fuzz_http(target, 23, scaled(40, 300)))
        report("100 MiB messages" if FULL else "16 MiB messages", probes.big_messages(target, scaled(16, 100)))
        report("idle and reset connections", probes.idle_connections(target, scaled(30, 300)))
        unread = probes.unread_streams(target, scaled(2, 5), scaled(2, 4), scaled(10, 40), scaled(1, 3))
        report("unread streams", unread)
        kill, recovery = probes.kill_under_load(target, scaled(4, 20))
        report("worker kill under load", kill, f" (served by a new process after {recovery:.2f} s; -1: never)")
        report("soak", probes.soak(target, scaled(4, 60)))
        drain, status = probes.drain_on_sigterm(lambda: target)
        report("SIGTERM drain", drain, f" (exit status {status})")
    finally:
        stop(target)
    # hostile clients last, one group at a time, on a server of their own: a server one of them kills (Triton
    # 2.51 dies on a shrunk region and on deep JSON) is replaced before the next group
    hostile_target = start(args.server, repo, tmp / "hostile.log")
    try:
        for group in [*hostile.GROUPS, hostile.split_malformed_chunk]:
            if not hostile_target.alive():
                stop(hostile_target)
                hostile_target = start(args.server, repo, tmp / f"hostile-{group.__name__}.log")
            if group is hostile.split_malformed_chunk:
                tally = Tally()
                group(hostile_target, tally, random.Random(25))
            else:
                tally = hostile.fuzz_hostile(hostile_target, 24, scaled(1, 3), only=[group.__name__])
            examples = {k: v[:160] for k, v in tally.examples.items() if k != "OK"}
            report(f"hostile: {group.__name__}", tally, f"  examples {examples}")
    finally:
        stop(hostile_target)
    length = "full" if FULL else "short"
    print(total.line(f"reliability ({args.server}, {length})"))
    print(f"server log: {target.log}", file=sys.stderr)
    return 0 if total.clean() else 1


if __name__ == "__main__":
    sys.exit(main())
