"""`--host-policy=<name>,<setting>=<value>` (Triton's flag): the CPU cores and NUMA node of model instances.

Settings, as in Triton: `numa-node=<id>` binds the memory of the instance's worker process to that node (and, where
`cpu-cores` is not given, its threads to the node's cores: Triton leaves them anywhere); `cpu-cores=<list>` pins
the worker's threads to those cores: ranges and lists, `0-3,8` (Triton takes one `<low>-<high>` range only).
A model instance uses the policy its `instance_group { host_policy: "<name>" }` names, or else the policy named
like its device, Triton's default names: `cpu` (KIND_CPU), `gpu_<id>` (KIND_GPU), `model` (KIND_MODEL).

Every value is checked when the server starts (a bad one stops it, naming the flag); a policy name that an
instance group names but no flag defines fails that model's load (Triton silently ignores it).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

SETTINGS = ("numa-node", "cpu-cores")
NODE_ROOT = "/sys/devices/system/node"


@dataclass(slots=True)
class HostPolicy:
    """One named policy, its settings merged from every --host-policy entry that names it."""

    name: str
    numa_node: int | None = None
    cpu_cores: tuple[int, ...] = ()  # as given ("" = not given)
    node_cores: tuple[int, ...] = ()  # the NUMA node's cores (where the machine reports them)
    bind_memory: bool = False  # numa-node given on a machine that reports NUMA nodes (else memory stays unbound)

    def cores(self) -> tuple[int, ...]:
        """The cores the instance's threads may run on: cpu-cores, else the node's cores, else () (anywhere)."""
        return self.cpu_cores or self.node_cores


def parse_core_list(text: str) -> tuple[int, ...]:
    """'0-3,8' -> (0, 1, 2, 3, 8); ValueError naming the part that is not a core id or `<low>-<high>` range."""
    cores: set[int] = set()
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"'{part}' is neither a core id nor a <low>-<high> range of core ids")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise ValueError(f"range '{part}' ends before it starts")
        cores.update(range(first, last + 1))
    return tuple(sorted(cores))


def format_cores(cores: Iterable[int]) -> str:
    """(0, 1, 2, 5) -> '0-2,5' (the kernel's cpulist form)."""
    out: list[str] = []
    ordered = sorted(cores)
    start = prev = ordered[0] if ordered else 0
    for core in [*ordered[1:], None]:
        if core is not None and core == prev + 1:
            prev = core
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if core is not None:
            start = prev = core
    return ",".join(out) if ordered else ""


def numa_nodes(root: str = NODE_ROOT) -> dict[int, tuple[int, ...]] | None:
    """NUMA node id -> its cores, from sysfs; None where the kernel reports no NUMA nodes."""
    try:
        names = os.listdir(root)
    except OSError:
        return None
    nodes: dict[int, tuple[int, ...]] = {}
    for name in names:
        if name.startswith("node") and name[4:].isdigit():
            try:
                with open(os.path.join(root, name, "cpulist"), encoding="ascii") as f:
                    text = f.read().strip()
            except OSError:
                text = ""
            nodes[int(name[4:])] = parse_core_list(text) if text else ()
    return nodes or None


def parse_host_policies(entries: list[str]) -> dict[str, HostPolicy]:
    """Policies by name from --host-policy entries, checked against this machine; ValueError for a bad entry."""
    return build_host_policies(entries, set(os.sched_getaffinity(0)), numa_nodes())


def build_host_policies(
    entries: list[str], usable: set[int], machine: dict[int, tuple[int, ...]] | None
) -> dict[str, HostPolicy]:
    """parse_host_policies for given machine facts: `usable`, the cores this server may run on (its own
    affinity); `machine`, its NUMA nodes and their cores (None: it reports none; then only node 0 is accepted,
    the whole machine, and memory stays unbound)."""
    policies: dict[str, HostPolicy] = {}
    for entry in entries:
        name, comma, setting = entry.partition(",")
        key, equals, value = setting.partition("=")
        if not name or not comma or not equals:
            raise ValueError(f"'{entry}' is not <name>,<setting>=<value>")
        if key not in SETTINGS:
            raise ValueError(
                f"Unsupported host policy setting '{key}' is specified, supported settings are 'numa-node', 'cpu-cores'"
            )
        policy = policies.setdefault(name, HostPolicy(name))
        if key == "numa-node":
            if not value.isascii() or not value.isdigit():
                raise ValueError(f"Parsing 'numa-node' value: Can't parse '{value}' to integer")
            node = int(value)
            known = sorted(machine) if machine is not None else [0]
            if node not in known:
                raise ValueError(
                    f"host policy '{name}': numa-node {node} does not exist on this machine (its NUMA nodes: "
                    f"{', '.join(map(str, known))})"
                )
            policy.numa_node, policy.bind_memory = node, machine is not None
            policy.node_cores = tuple(c for c in (machine or {}).get(node, ()) if c in usable)
        else:
            try:
                cores = parse_core_list(value)
            except ValueError as e:
                raise ValueError(f"host policy '{name}': cpu-cores '{value}': {e}") from None
            outside = [c for c in cores if c not in usable]
            if outside:
                raise ValueError(
                    f"host policy '{name}': cpu-cores '{value}' names core(s) {format_cores(outside)}, but this "
                    f"server may only run on cores {format_cores(usable)}"
                )
            policy.cpu_cores = cores
    return policies


def default_policy_name(kind: str, device_id: int) -> str:
    """Triton's host policy name for an instance whose group names none: cpu, gpu_<id> or model."""
    return f"gpu_{device_id}" if kind == "GPU" else kind.lower()
