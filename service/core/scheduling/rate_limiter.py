"""Triton's rate limiter (`--rate-limit=execution_count`): instances run only while they hold their resources.

Each instance lists resources in `instance_group { rate_limiter { resources [...] priority } }`; a resource is
per device (the instance's device; CPU instances are on device 0) or `global` (one pool for the server). What
exists of a resource is the largest count any loaded instance asks for, or what `--rate-limit-resource` gives
(then a resource it does not name has none). A batch a scheduler hands to an instance is staged here; staged
batches start in the order of their instance's scaled priority (executions so far x priority, as Triton's),
the first one waiting until its resources are free, and give the resources back when their execution is done.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from service.config.groups.rate_limit import PER_DEVICE, ResourceLimit
from service.errors import ErrorCode, ServiceError

log = logging.getLogger("trireme.rate_limiter")

GLOBAL = -1  # the device key of global resources

# (device or GLOBAL, resource name) -> count
Resources = dict[tuple[int, str], int]


@dataclass(slots=True)
class _Instance:
    """An instance known to the limiter: what it needs, its weight, how often it has run."""

    owner: Any  # the scheduler that runs it
    needs: Resources
    priority: int
    executions: int = 0

    def scaled(self) -> int:
        # priority 0 counts as 1, as Triton's
        return self.executions * max(self.priority, 1)


@dataclass(slots=True)
class _Staged:
    instance: _Instance
    worker: Any
    batch: list[Any]
    run: Callable[[Any, list[Any]], None]
    seq: int


@dataclass(slots=True)
class RateLimiter:
    """The server-wide rate limiter; schedulers stage batches with `admit` and give resources back with `release`."""

    explicit: list[ResourceLimit] = field(default_factory=list)
    instances: dict[tuple[Any, str], _Instance] = field(default_factory=dict)  # (scheduler, instance name) -> ...
    available: Resources = field(default_factory=dict)
    allocated: Resources = field(default_factory=dict)
    staged: list[_Staged] = field(default_factory=list)
    _seq: Any = field(default_factory=itertools.count)

    # ---- instances ------------------------------------------------------------------------------------------
    def add_model(self, owner: Any, config: Any, workers: list[Any]) -> None:
        """Register a model version's instances; ServiceError INVALID_ARG (Triton's message) when the resources
        that exist cannot run one of them (nothing is registered then)."""
        groups = {g.name: g for g in config.instance_group}
        added = {}
        for worker in workers:
            group = groups.get(getattr(worker.spec, "group_name", ""))
            added[(owner, worker.spec.instance_name)] = _instance(owner, group, worker.spec.device_id)
        before = dict(self.instances)
        self.instances.update(added)
        try:
            self._compute()
        except ServiceError:
            self.instances = before
            self._compute()
            raise

    def add_worker(self, owner: Any, config: Any, worker: Any) -> None:
        """An instance added by an instance-count update; logged and left unlimited when it cannot fit."""
        try:
            self.add_model(owner, config, [worker])
        except ServiceError as e:
            log.error("instance '%s' is not rate limited: %s", worker.spec.instance_name, e.message)

    def remove_model(self, owner: Any) -> list[_Staged]:
        """Forget a scheduler's instances; returns its batches still staged (the caller answers them)."""
        dropped = [s for s in self.staged if s.instance.owner is owner]
        self.staged = [s for s in self.staged if s.instance.owner is not owner]
        self.instances = {w: i for w, i in self.instances.items() if i.owner is not owner}
        self._compute()
        self._attempt()
        return dropped

    def _compute(self) -> None:
        """What exists of each resource (Triton's max over instances, or the explicit counts), validated."""
        most: Resources = {}
        for inst in self.instances.values():
            for key, count in inst.needs.items():
                most[key] = max(most.get(key, 0), count)
        global_names = {name for device, name in most if device == GLOBAL}
        for device, name in most:
            if device != GLOBAL and name in global_names:
                raise ServiceError(
                    ErrorCode.INVALID_ARG,
                    f'Resource "{name}" is present as both global and device-specific resource in the model '
                    "configuration.",
                )
        if self.explicit:
            for key, need in most.items():
                have = self._explicit_count(*key)
                if have < need:
                    raise ServiceError(
                        ErrorCode.INVALID_ARG,
                        f'Resource count for "{key[1]}" is limited to {have} which will prevent scheduling of one or '
                        f"more model instances, the minimum required count is {need}",
                    )
                most[key] = have
        self.available = most

    def _explicit_count(self, device: int, name: str) -> int:
        counts = [
            r.count for r in self.explicit if r.name == name and (device == GLOBAL or r.device in (device, PER_DEVICE))
        ]
        return max(counts, default=0)

    # ---- execution --------------------------------------------------------------------------------------------
    def admit(self, owner: Any, worker: Any, batch: list[Any], run: Callable[[Any, list[Any]], None]) -> None:
        """Run `batch` on `worker` (through `run`) now or, once its turn comes and its resources are free, later."""
        inst = self.instances.get((owner, worker.spec.instance_name))
        if inst is None:  # not registered (rate limiting began after it): runs unlimited
            run(worker, batch)
            return
        self.staged.append(_Staged(inst, worker, batch, run, next(self._seq)))
        self._attempt()

    def release(self, owner: Any, worker: Any) -> None:
        """`worker` finished an execution: give its resources back and start what can start now."""
        inst = self.instances.get((owner, worker.spec.instance_name))
        if inst is None:
            return
        inst.executions += 1
        for key, count in inst.needs.items():
            self.allocated[key] = self.allocated.get(key, 0) - count
        self._attempt()

    def _attempt(self) -> None:
        """Start staged batches in priority order; the first that cannot get its resources waits (as Triton's)."""
        while self.staged:
            best = min(self.staged, key=lambda s: (s.instance.scaled(), s.seq))
            if not self._allocate(best.instance):
                return
            self.staged.remove(best)
            best.run(best.worker, best.batch)

    def _allocate(self, inst: _Instance) -> bool:
        for key, count in inst.needs.items():
            if self.allocated.get(key, 0) + count > self.available.get(key, 0):
                return False
        for key, count in inst.needs.items():
            self.allocated[key] = self.allocated.get(key, 0) + count
        return True


def _instance(owner: Any, group: Any, device: int) -> _Instance:
    needs: Resources = {}
    priority = 0
    if group is not None and group.HasField("rate_limiter"):
        priority = group.rate_limiter.priority
        for r in group.rate_limiter.resources:
            needs[(GLOBAL if getattr(r, "global") else device, r.name)] = r.count
    return _Instance(owner, needs, priority)
