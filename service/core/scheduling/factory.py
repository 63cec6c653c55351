"""Picks the scheduler a model version gets from its config."""

from __future__ import annotations

from typing import Any

from service.core.scheduling.direct import DirectScheduler
from service.core.scheduling.dynamic_batcher import DynamicBatcher
from service.core.scheduling.rate_limiter import RateLimiter
from service.core.scheduling.scheduler import InstanceScheduler, Scheduler
from service.core.scheduling.views import ModelView
from service.errors import ErrorCode, ServiceError
from service.instances.pool import InstancePool


def make_scheduler(
    mv: ModelView, pool: InstancePool | None, engine: Any = None, limiter: RateLimiter | None = None
) -> Scheduler:
    """Direct, dynamic-batching, sequence or ensemble scheduler, as the config's scheduling_choice says.

    `engine` (service.core.engine.Engine, a StepRunner) is what an ensemble submits its steps to; `limiter`
    (--rate-limit=execution_count) gates the executions of the instances (ServiceError when they cannot fit).
    """
    scheduler = _make(mv, pool, engine)
    if limiter is not None and pool is not None and isinstance(scheduler, InstanceScheduler):
        limiter.add_model(scheduler, mv.config, pool.workers)
        scheduler.use_rate_limiter(limiter)
    return scheduler


def _make(mv: ModelView, pool: InstancePool | None, engine: Any) -> Scheduler:
    config = mv.config
    choice = config.WhichOneof("scheduling_choice")
    if choice == "ensemble_scheduling" and engine is not None:
        from service.core.scheduling.ensemble import EnsembleScheduler

        return EnsembleScheduler(mv, engine)
    if choice == "ensemble_scheduling" or pool is None:
        raise ServiceError(ErrorCode.UNSUPPORTED, f"model '{mv.name}': ensembles are not supported yet")
    if choice == "sequence_batching":
        from service.core.scheduling.sequence_batcher import SequenceBatcher

        return SequenceBatcher(pool, mv.stats, config, mv.model_dir)
    if choice == "dynamic_batching":
        return DynamicBatcher(pool, mv.stats, config)
    return DirectScheduler(pool, mv.stats)
