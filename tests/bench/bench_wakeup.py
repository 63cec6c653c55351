"""What one server <-> worker round trip costs by transport, with nothing else in it: is a shared-memory ring worth it?

Two processes ping-pong a 100-byte message (a small Execute frame's size) --n times, each pinned (taskset-style,
os.sched_setaffinity) to the CPUs given, and print the median and p90 round trip in µs and the CPU µs both
processes spent per round trip:
- socketpair: today's channel (a frame written to a Unix stream socket, read by a blocking recv);
- pipe: the same over two pipes;
- eventfd ring: the message written into a shared mapping, an eventfd as the doorbell (a ring for small tensors:
  the data moves through memory, but the reader must still be woken, through the kernel);
- spin ring: the message in a shared mapping, the reader polls a sequence number (no system call, no wake-up: it
  keeps a CPU busy while it waits, so only worth it on spare cores).

Usage: .venv/bin/python tests/bench/bench_wakeup.py [--n 20000] [--cpus 0 1]
"""

from __future__ import annotations

import argparse
import mmap
import os
import socket
import statistics
import struct
import time
from collections.abc import Callable

MESSAGE = b"x" * 100
SEQ = struct.Struct("<Q")


def _pin(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})


def _run(n: int, cpus: tuple[int, int], make: Callable[[], tuple[Callable[[], None], Callable[[], None]]]) -> tuple:
    """make() -> (parent_round_trip, child_echo), created before the fork; returns (median, p90, cpu) in µs."""
    parent_rt, child_echo = make()
    pid = os.fork()
    if pid == 0:
        _pin(cpus[1])
        try:
            for _ in range(n + 100):
                child_echo()
        finally:
            os._exit(0)
    _pin(cpus[0])
    for _ in range(100):
        parent_rt()
    times = []
    c0 = os.times()
    for _ in range(n):
        t0 = time.perf_counter_ns()
        parent_rt()
        times.append(time.perf_counter_ns() - t0)
    os.waitpid(pid, 0)
    c1 = os.times()
    cpu = (c1.user + c1.system + c1.children_user + c1.children_system) - (c0.user + c0.system)
    times.sort()
    return statistics.median(times) / 1e3, times[int(0.9 * n)] / 1e3, cpu / n * 1e6


def socketpair() -> tuple[Callable[[], None], Callable[[], None]]:
    a, b = socket.socketpair()

    def rt() -> None:
        a.sendall(MESSAGE)
        a.recv(4096)

    def echo() -> None:
        b.sendall(b.recv(4096))

    return rt, echo


def pipes() -> tuple[Callable[[], None], Callable[[], None]]:
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()

    def rt() -> None:
        os.write(w1, MESSAGE)
        os.read(r2, 4096)

    def echo() -> None:
        os.write(w2, os.read(r1, 4096))

    return rt, echo


def eventfd_ring() -> tuple[Callable[[], None], Callable[[], None]]:
    ring = mmap.mmap(-1, 4096)
    there, back = os.eventfd(0), os.eventfd(0)

    def rt() -> None:
        ring[0:100] = MESSAGE
        os.eventfd_write(there, 1)
        os.eventfd_read(back)
        bytes(ring[100:200])

    def echo() -> None:
        os.eventfd_read(there)
        ring[100:200] = ring[0:100]
        os.eventfd_write(back, 1)

    return rt, echo


def spin_ring() -> tuple[Callable[[], None], Callable[[], None]]:
    ring = mmap.mmap(-1, 4096)
    state = {"seq": 0}

    def rt() -> None:
        seq = state["seq"] + 1
        state["seq"] = seq
        ring[16:116] = MESSAGE
        SEQ.pack_into(ring, 0, seq)
        while SEQ.unpack_from(ring, 8)[0] != seq:
            pass
        bytes(ring[116:216])

    def echo() -> None:
        seq = state["seq"] + 1
        state["seq"] = seq
        while SEQ.unpack_from(ring, 0)[0] != seq:
            pass
        ring[116:216] = ring[16:116]
        SEQ.pack_into(ring, 8, seq)

    return rt, echo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--cpus", type=int, nargs=2, default=[0, 1])
    ap.add_argument("--no-spin", action="store_true", help="leave out the spin ring (e.g. with both on one CPU)")
    args = ap.parse_args()
    kinds = {"socketpair": socketpair, "pipe": pipes, "eventfd ring": eventfd_ring, "spin ring": spin_ring}
    if args.no_spin or args.cpus[0] == args.cpus[1]:
        del kinds["spin ring"]
    print(f"CPUs {args.cpus[0]} and {args.cpus[1]}, {args.n} round trips of {len(MESSAGE)} bytes")
    print("| transport | round trip p50 µs | p90 µs | CPU µs per round trip (both processes) |")
    print("|---|---|---|---|")
    for name, make in kinds.items():
        p50, p90, cpu = _run(args.n, (args.cpus[0], args.cpus[1]), make)
        print(f"| {name} | {p50:.1f} | {p90:.1f} | {cpu:.1f} |")


if __name__ == "__main__":
    main()
