"""What a (re)load does to each version of a model: keep, update in place (instance groups only), start, leave."""

from __future__ import annotations

from dataclasses import dataclass, field

from protos import model_config_pb2 as mc
from service.core.repository.instance_plan import without_instances
from service.core.repository.model_version import ModelEntry, ModelVersion
from service.core.repository.snapshots import ModelFiles


@dataclass(slots=True)
class LoadPlan:
    """What one (re)load does to each version."""

    config: mc.ModelConfig
    keep: dict[int, ModelVersion] = field(default_factory=dict)  # unchanged, serving
    update: dict[int, ModelVersion] = field(default_factory=dict)  # serving; only instance groups change
    start: list[int] = field(default_factory=list)  # new versions, or changed ones (replaced once READY)
    leave: list[ModelVersion] = field(default_factory=list)  # serving versions the policy no longer selects


def plan_load(
    entry: ModelEntry,
    config: mc.ModelConfig,
    chosen: list[int],
    serving: dict[int, ModelVersion],
    files: ModelFiles,
) -> LoadPlan:
    """Compare the chosen versions with the serving ones: changed files or config start anew, a change in instance
    groups alone updates in place, the rest is kept; serving versions not chosen leave."""
    plan = LoadPlan(config)
    base = without_instances(config)
    for v in chosen:
        cur = serving.get(v)
        if (
            cur is None
            or cur.files != files.versions.get(v, ())
            or entry.model_files != files.model_level
            or without_instances(cur.config) != base
        ):
            plan.start.append(v)
        elif list(cur.config.instance_group) == list(config.instance_group) or cur.pool is None:
            plan.keep[v] = cur
            cur.config = config  # e.g. a new version policy
        else:
            plan.update[v] = cur
    plan.leave = [mv for v, mv in serving.items() if v not in chosen]
    return plan
