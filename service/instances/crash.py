"""A worker that exits or crashes, server side: stop using it at once, then fail what it held with its exit
status and tell the pool (which restarts it unless it was retired)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from service.errors import ErrorCode, ServiceError
from service.instances.readiness import ReadinessProbe
from service.instances.spec import InstanceSpec
from service.instances.transfer import _Inflight
from service.ipc import frames as ipc
from service.types import InferResponse


class CrashHandling:
    """WorkerProcess's end-of-life path (a mixin: the state is the WorkerProcess's own)."""

    alive: bool
    retired: str
    proc: asyncio.subprocess.Process | None
    inflight: dict[int, _Inflight]
    batches: dict[int, tuple[list[int], Callable[[Any, ipc.ExecDone | None], None]]]
    on_exit: Callable[[Any], None] | None
    _closed: asyncio.Future[None]
    _startup: asyncio.Future[Any] | None
    readiness: ReadinessProbe
    _reap_task: asyncio.Task[None] | None
    spec: InstanceSpec

    def _check_idle(self) -> None:
        raise NotImplementedError

    def close_channel(self) -> None:
        raise NotImplementedError

    def on_connection_lost(self) -> None:
        """The worker exited or crashed: stop using it now; fail its requests once its exit status is known."""
        was_alive = self.alive
        self.alive = False
        self.close_channel()  # the pipe to the worker too: nothing more is written to it
        self.readiness.lost()
        if not self._closed.done():
            self._closed.set_result(None)
        if self._startup is not None and not self._startup.done():
            self._startup.set_result(ipc.Failed(f"model instance '{self.spec.instance_name}' exited during start-up"))
        task = asyncio.get_running_loop().create_task(self._reap(was_alive))
        self._reap_task = task  # keep a reference until it is done

    async def _reap(self, was_alive: bool) -> None:
        code = None
        if self.proc is not None:
            try:
                code = await asyncio.wait_for(self.proc.wait(), 2.0)
            except TimeoutError:
                code = None
        error = ServiceError(
            ErrorCode.UNAVAILABLE,
            self.retired
            or f"Stub process '{self.spec.instance_name}' is not healthy: it exited while running the request"
            + (f" (exit status {code})" if code is not None else "")
            + "; the instance is being restarted",
        )
        inflight, self.inflight = self.inflight, {}
        for rec in inflight.values():
            if rec.request.on_response is not None:
                rec.request.on_response(
                    InferResponse(rec.request.model_name, rec.request.model_version, rec.request.id, error=error)
                )
        batches, self.batches = self.batches, {}
        for _rids, on_done in batches.values():
            on_done(self, None)
        self._check_idle()
        if was_alive and self.on_exit is not None:
            self.on_exit(self)
