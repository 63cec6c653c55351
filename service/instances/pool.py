"""InstancePool: the worker processes of one model version, with crash detection and restart."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from service.instances.process import InstanceSpec, WorkerProcess

log = logging.getLogger("trireme.workers")

RESTART_BACKOFF_S = (0.0, 0.5, 1.0, 2.0, 5.0)


def _instance(spec: InstanceSpec, on_exit: Callable[[WorkerProcess], None]) -> WorkerProcess:
    """A worker process, or an in-process instance when the model's config asks for one."""
    if spec.in_process:
        from service.instances.inprocess import InProcessInstance

        return InProcessInstance(spec, on_exit)
    return WorkerProcess(spec, on_exit)


class InstancePool:
    """Starts `instance_group` workers, tells its listener when one becomes available, restarts crashed ones."""

    def __init__(self, specs: list[InstanceSpec]) -> None:
        self.specs = specs
        self.workers: list[WorkerProcess] = []
        self.on_available: Callable[[WorkerProcess], None] = lambda w: None
        self.on_lost: Callable[[WorkerProcess], None] = lambda w: None
        self._restarts: set[asyncio.Task[None]] = set()
        self._failures: dict[str, int] = {}
        self.restarts = 0  # crashed instances restarted (metrics: trireme_instance_restarts)
        self._stopping = False

    async def start(self) -> None:
        """Start every instance concurrently; on any failure stop the others and re-raise the first error."""
        workers = [_instance(spec, self._on_exit) for spec in self.specs]
        results = await asyncio.gather(*(w.start() for w in workers), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            self._stopping = True  # the instances that did start are stopped, not restarted
            await asyncio.gather(*(w.stop(1.0) for w in workers), return_exceptions=True)
            raise errors[0]
        self.workers = workers

    async def add(self, specs: list[InstanceSpec]) -> list[WorkerProcess]:
        """Start more instances (an instance-count update); on any failure none is added and the error raised.

        The caller hands the new workers to its scheduler; existing instances are untouched.
        """
        workers = [_instance(spec, self._on_exit) for spec in specs]
        results = await asyncio.gather(*(w.start() for w in workers), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await asyncio.gather(*(w.stop(1.0) for w in workers), return_exceptions=True)
            raise errors[0]
        self.specs = self.specs + specs
        self.workers = self.workers + workers
        return workers

    async def remove(self, workers: list[WorkerProcess], reason: str, timeout_s: float) -> None:
        """Take instances out (an instance-count update): they get no new work, finish what they run, finalize.

        The caller has already told its scheduler (`remove_worker`), so nothing new reaches them.
        """
        for w in workers:
            w.retire(reason)
        gone = {id(w) for w in workers}
        self.workers = [w for w in self.workers if id(w) not in gone]
        self.specs = [s for s in self.specs if all(s is not w.spec for w in workers)]
        await asyncio.gather(*(w.wait_idle(timeout_s) for w in workers))
        await asyncio.gather(*(w.stop(timeout_s) for w in workers), return_exceptions=True)

    @property
    def ready(self) -> bool:
        """True when every instance is alive (false while one is being restarted)."""
        return bool(self.workers) and all(w.alive for w in self.workers) and not self._restarts

    def _on_exit(self, worker: WorkerProcess) -> None:
        if self._stopping:
            return
        log.error("model instance '%s' (pid %s) exited; restarting it", worker.spec.instance_name, worker.pid)
        self.on_lost(worker)
        task = asyncio.get_running_loop().create_task(self._restart(worker))
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _restart(self, dead: WorkerProcess) -> None:
        name = dead.spec.instance_name
        await dead.kill()
        while not self._stopping:
            attempt = self._failures.get(name, 0)
            await asyncio.sleep(RESTART_BACKOFF_S[min(attempt, len(RESTART_BACKOFF_S) - 1)])
            if self._stopping:
                return
            fresh = _instance(dead.spec, self._on_exit)
            try:
                await fresh.start()
            except Exception as e:
                self._failures[name] = attempt + 1
                log.error("restart of model instance '%s' failed: %s", name, e)
                continue
            self._failures[name] = 0
            if all(w is not dead for w in self.workers):  # removed by an instance update meanwhile
                await fresh.stop(1.0)
                return
            self.workers = [fresh if w is dead else w for w in self.workers]
            self.restarts += 1
            log.info("model instance '%s' restarted (pid %s)", name, fresh.pid)
            self.on_available(fresh)
            return

    async def stop(self, timeout_s: float = 10.0, reason: str = "") -> None:
        """Finalize and stop every instance (and any restart in progress).

        Requests still running when an instance goes fail with `reason` (e.g. the unload timeout passed).
        """
        self._stopping = True
        if reason:
            for w in self.workers:
                w.retire(reason)
        for task in list(self._restarts):
            task.cancel()
        await asyncio.gather(*self._restarts, return_exceptions=True)
        await asyncio.gather(*(w.stop(timeout_s) for w in self.workers), return_exceptions=True)
        self.workers = []
