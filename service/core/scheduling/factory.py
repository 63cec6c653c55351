"""Picks the scheduler a model version gets from its config."""

from __future__ import annotations

from typing import Any

from service.core.scheduling.dynamic_batcher import DynamicBatcher
from service.core.scheduling.scheduler import DirectScheduler, Scheduler
from service.core.scheduling.views import ModelView
from service.errors import ErrorCode, ServiceError
from service.instances.pool import InstancePool


def make_scheduler(mv: ModelView, pool: InstancePool | None, engine: Any = None) -> Scheduler:
    """Direct, dynamic-batching, sequence or ensemble scheduler, as the config's scheduling_choice says.

    `engine` (service.core.engine.Engine, a StepRunner) is what an ensemble submits its steps to.
    """
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
