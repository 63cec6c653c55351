"""What the reliability probes count (cases, crashes, hangs, lost, wrong, RSS growth) and the one summary line."""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import grpc

FULL = os.environ.get("TRIREME_RELIABILITY", "").lower() == "full"  # full length (>= 1000 fuzz cases, long soak)


def scaled(short: int, full: int) -> int:
    """`full` when TRIREME_RELIABILITY=full, else `short` (the CI length)."""
    return full if FULL else short


@dataclass
class Target:
    """A running server under test: addresses, its process, how to start another one like it."""

    name: str  # "trireme" or "triton"
    grpc_url: str
    http_url: str  # "" when the server has no HTTP endpoint
    proc: subprocess.Popen[bytes]
    log: Path | None = None  # where its output goes
    log_file: IO[bytes] | None = field(default=None, repr=False)  # open until stop()

    def children(self) -> list[int]:
        """PIDs of the server's direct children (workers / Python-backend stubs)."""
        try:
            text = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except OSError:
            return []
        return sorted(int(p) for p in text.split())

    def rss_bytes(self) -> int:
        """Resident memory of the server and its children."""
        total = 0
        for pid in [self.proc.pid, *self.children()]:
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            except OSError:
                continue
        return total

    def alive(self) -> bool:
        """The process runs and answers ServerLive within 10 s."""
        if self.proc.poll() is not None:
            return False
        with grpc.insecure_channel(self.grpc_url) as channel:
            live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")
            try:
                live(b"", timeout=10)
            except grpc.RpcError:
                return False
        return True


@dataclass
class Tally:
    """Counts of one probe (or of all of them, summed)."""

    cases: int = 0
    crashes: int = 0  # server died, or a worker process was replaced, while probing
    hangs: int = 0  # no answer within the deadline
    lost: int = 0  # a request that never got its answer (streams), or was answered twice
    wrong: int = 0  # a valid request answered with a wrong result or an error
    rss_growth: int = 0  # bytes, server and children, over the soak / repeated probes
    statuses: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)  # status -> the first message answered with it
    seconds: float = 0.0

    def add(self, other: Tally) -> None:
        """Sum another probe's counts into this one (RSS growth: the largest)."""
        self.cases += other.cases
        self.crashes += other.crashes
        self.hangs += other.hangs
        self.lost += other.lost
        self.wrong += other.wrong
        self.rss_growth = max(self.rss_growth, other.rss_growth)
        self.statuses.update(other.statuses)
        for k, v in other.examples.items():
            self.examples.setdefault(k, v)
        self.seconds += other.seconds

    def line(self, label: str) -> str:
        """The one summary line."""
        return (
            f"{label}: cases tried {self.cases}, crashes {self.crashes}, hangs {self.hangs}, lost {self.lost}, "
            f"wrong {self.wrong}, RSS growth {self.rss_growth / 2**20:.1f} MiB"
        )

    def clean(self) -> bool:
        """Nothing crashed, hung, got lost or came back wrong."""
        return not (self.crashes or self.hangs or self.lost or self.wrong)


class Timer:
    """Adds the elapsed wall time to a tally."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally
        self.start = 0.0

    def __enter__(self) -> Timer:
        self.start = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.tally.seconds += time.monotonic() - self.start
