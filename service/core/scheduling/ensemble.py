"""The ensemble scheduler: runs an ensemble's steps through the engine as soon as their inputs are ready.

Each step becomes an ordinary request to its composing model (Engine.submit), so composing models keep their
own schedulers, batching and statistics. Tensors move between steps by reference: a step's input is the very
bytes object (or client shared-memory reference) the producing step or the client supplied; nothing is copied
here. Independent steps run in parallel. A decoupled composing model may answer a step many times: each
response is a new "iteration" whose tensors carry a key (a tuple, one index per decoupled step on the path)
and downstream steps run once per iteration, pairing tensors whose keys are prefixes of each other.

An ensemble that is decoupled, or has a decoupled step (directly or in a nested ensemble), streams one
response per complete set of outputs as the sets complete (zero, one or many), then a bare final flag, as
Triton does; the ensemble itself need not be marked decoupled. A request that must be answered exactly once
(ModelInfer, a non-decoupled BLS call: `InferRequest.single_response`) gets the single set at the end instead,
and an error when the steps produced another number of sets.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from service.core.scheduling.drain import DrainSignal
from service.core.scheduling.ensemble_graph import Step, validate_graph, validate_models
from service.core.scheduling.scheduler import Scheduler
from service.core.scheduling.views import ModelView, StepRunner
from service.errors import ErrorCode, ServiceError
from service.types import InferRequest, InferResponse, InputTensor, OutputTensor, RequestedOutput

Key = tuple[int, ...]
_OUTPUTS = -1  # pseudo step index of "the ensemble's outputs are complete"


@dataclass(slots=True, eq=False)
class _Run:
    """One ensemble request in flight."""

    request: InferRequest
    tensors: dict[str, dict[Key, InputTensor | None]] = field(default_factory=dict)
    launched: set[tuple[int, Key]] = field(default_factory=set)
    inflight: dict[InferRequest, Any] = field(default_factory=dict)  # step request -> its ModelVersion
    output_sets: list[list[OutputTensor]] = field(default_factory=list)
    error: ServiceError | None = None
    done: bool = False


class EnsembleScheduler(Scheduler):
    """Scheduler of a `platform: "ensemble"` model version; validates the graph when created (at load)."""

    def __init__(self, mv: ModelView, engine: StepRunner) -> None:
        self.mv = mv
        self.engine = engine
        self.stats = mv.stats
        config = mv.config
        self.steps = validate_graph(config)
        validate_models(config, self.steps, self._step_config)
        self.decoupled = config.model_transaction_policy.decoupled
        # answers 0..N times (a decoupled step somewhere below): composing models are loaded by now
        self.streams = self.decoupled or any(self._step_streams(step) for step in self.steps)
        self.output_names = [t.name for t in config.output]
        self.consumers: dict[str, list[Step]] = {}
        for step in self.steps:
            for tensor in set(step.inputs.values()):
                self.consumers.setdefault(tensor, []).append(step)
        self.runs: dict[InferRequest, _Run] = {}
        self._drain = DrainSignal()

    def _step_config(self, step: Step) -> Any:
        return self.engine.repository.get(step.model_name, step.model_version).config

    def _step_streams(self, step: Step) -> bool:
        try:
            return self.engine.repository.get(step.model_name, step.model_version).streams
        except ServiceError:
            return False

    @property
    def ready(self) -> bool:
        """Ready while every composing model has a ready version."""
        for step in self.steps:
            try:
                if not self.engine.repository.get(step.model_name, step.model_version).ready:
                    return False
            except ServiceError:
                return False
        return True

    # ---- requests --------------------------------------------------------------------------------------
    def enqueue(self, request: InferRequest) -> None:
        run = _Run(request)
        self.runs[request] = run
        given = {t.name: t for t in request.inputs}
        for t in self.mv.config.input:
            run.tensors[t.name] = {(): given.get(t.name)}  # None: an optional input the client left out
        self._advance(run, list(run.tensors), ())
        self._maybe_finish(run)

    async def drain(self, timeout_s: float) -> bool:
        """Wait until every ensemble request in flight has finished (bounded by timeout_s)."""
        return await self._drain.wait(bool(self.runs), timeout_s)

    def cancel(self, request: InferRequest) -> None:
        run = self.runs.get(request)
        if run is None:
            return
        if run.error is None:
            run.error = ServiceError(ErrorCode.CANCELLED, "request cancelled by the client")
        self._cancel_steps(run)

    def _cancel_steps(self, run: _Run) -> None:
        for sub, mv in list(run.inflight.items()):
            if mv is not None:
                self.engine.cancel(sub, mv)

    # ---- graph execution -------------------------------------------------------------------------------
    def _advance(self, run: _Run, produced: list[str], key: Key) -> None:
        """Start every step (and emit every output set) that the tensors just produced at `key` complete."""
        if run.error is not None:
            return
        steps: dict[int, Step] = {}
        for tensor in produced:
            for step in self.consumers.get(tensor, ()):
                steps[step.index] = step
        for step in steps.values():
            for launch_key in self._candidate_keys(run, list(step.inputs.values()), key):
                values = self._resolve(run, step.inputs.values(), launch_key)
                if values is not None and (step.index, launch_key) not in run.launched:
                    run.launched.add((step.index, launch_key))
                    self._launch(run, step, launch_key, values)
                    if run.error is not None:
                        return
        if any(t in self.output_names for t in produced):
            for launch_key in self._candidate_keys(run, self.output_names, key):
                values = self._resolve(run, self.output_names, launch_key)
                if values is not None and (_OUTPUTS, launch_key) not in run.launched:
                    run.launched.add((_OUTPUTS, launch_key))
                    self._emit(run, values)

    @staticmethod
    def _candidate_keys(run: _Run, tensors: list[str], key: Key) -> set[Key]:
        """`key` and every longer key some of `tensors` already have below it."""
        keys = {key}
        for tensor in tensors:
            for k in run.tensors.get(tensor, ()):
                if len(k) > len(key) and k[: len(key)] == key:
                    keys.add(k)
        return keys

    @staticmethod
    def _resolve(run: _Run, tensors: Any, key: Key) -> dict[str, InputTensor | None] | None:
        """Each tensor's value at the longest prefix of `key`, or None when one is missing."""
        values: dict[str, InputTensor | None] = {}
        for tensor in tensors:
            versions = run.tensors.get(tensor)
            if versions is None:
                return None
            for n in range(len(key), -1, -1):
                if key[:n] in versions:
                    values[tensor] = versions[key[:n]]
                    break
            else:
                return None
        return values

    def _launch(self, run: _Run, step: Step, key: Key, values: dict[str, InputTensor | None]) -> None:
        request = run.request
        inputs = []
        for model_input, tensor in step.inputs.items():
            v = values[tensor]
            if v is not None:
                inputs.append(InputTensor(model_input, v.datatype, v.shape, v.data, v.shm))
        wanted = {o.name: o for o in request.outputs}
        outputs = []
        for model_output, tensor in step.outputs.items():
            edge = wanted.get(tensor)
            # write straight into the client's region when nothing downstream needs the bytes
            shm = edge.shm if edge is not None and edge.shm is not None and tensor not in self.consumers else None
            outputs.append(RequestedOutput(model_output, shm))
        sub = InferRequest(
            step.model_name,
            step.model_version,
            request.id,
            inputs,
            outputs,
            request.parameters,
            sequence_id=request.sequence_id,
            flags=request.flags,
            priority=request.priority,
            timeout_us=request.timeout_us,
        )
        if request.trace is not None:
            sub.trace = request.trace.child(step.model_name)
        counter = [0]
        run.inflight[sub] = None
        try:
            run.inflight[sub] = self.engine.submit(sub, partial(self._on_step_response, run, step, key, sub, counter))
        except ServiceError as e:
            run.inflight.pop(sub, None)
            self._fail(run, step, e)

    def _on_step_response(
        self, run: _Run, step: Step, key: Key, sub: InferRequest, counter: list[int], response: InferResponse
    ) -> None:
        if response.error is not None:
            self._fail(run, step, response.error)
        elif not response.null and run.error is None:
            mv = run.inflight.get(sub)
            out_key = (*key, counter[0]) if mv is not None and mv.streams else key
            counter[0] += 1
            produced = []
            for out in response.outputs:
                tensor = step.outputs.get(out.name)
                if tensor is None:
                    continue
                data = out.data
                run.tensors.setdefault(tensor, {})[out_key] = InputTensor(
                    tensor, out.datatype, out.shape, data if data is not None else None
                )
                produced.append(tensor)
            self._advance(run, produced, out_key)
        if response.final:
            run.inflight.pop(sub, None)
            self._maybe_finish(run)

    def _fail(self, run: _Run, step: Step, error: ServiceError) -> None:
        if run.error is None:
            message = error.message
            if error.code != ErrorCode.CANCELLED:
                message = f"in ensemble '{self.mv.name}', {step.label()}: {message}"
            run.error = ServiceError(error.code, message)
            self._cancel_steps(run)

    def _emit(self, run: _Run, values: dict[str, InputTensor | None]) -> None:
        request = run.request
        names = [o.name for o in request.outputs] or self.output_names
        outputs = []
        for name in names:
            v = values[name]
            if v is not None:
                outputs.append(OutputTensor(name, v.datatype, v.shape, v.data))
        if self.streams and not request.single_response:
            self._deliver(
                run, InferResponse(request.model_name, request.model_version, request.id, outputs, final=False)
            )
        else:
            run.output_sets.append(outputs)

    def _maybe_finish(self, run: _Run) -> None:
        if run.inflight or run.done:
            return
        run.done = True
        self.runs.pop(run.request, None)
        if not self.runs:
            self._drain.empty()
        request = run.request
        error = run.error
        streamed = self.streams and not request.single_response
        if error is None and not streamed and len(run.output_sets) != 1:
            error = ServiceError(
                ErrorCode.INTERNAL,
                f"in ensemble '{self.mv.name}', the steps produced {len(run.output_sets)} complete sets of outputs; "
                "a request answered exactly once (ModelInfer, a non-decoupled BLS call) needs exactly one: use "
                "ModelStreamInfer to receive every response",
            )
        if error is not None:
            response = InferResponse(request.model_name, request.model_version, request.id, error=error)
        elif streamed:
            response = InferResponse(request.model_name, request.model_version, request.id, null=True)
        else:
            response = InferResponse(request.model_name, request.model_version, request.id, run.output_sets[0])
        stats = self.stats
        stats.record_end(error is None, time.monotonic_ns() - request.arrival_ns)
        if error is None:
            stats.inference_count += request.batch_size
            stats.execution_count += 1
            stats.last_inference_ms = time.time_ns() // 1_000_000
        self._deliver(run, response)

    @staticmethod
    def _deliver(run: _Run, response: InferResponse) -> None:
        if run.request.on_response is not None:
            run.request.on_response(response)


class LoadBarrier:
    """Lets an ensemble's load wait for the models its steps use while those are still loading."""

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] = []
        self._waiting: dict[str, set[str]] = {}  # ensemble -> models it waits for

    async def wait(self, name: str, deps: set[str], loading: Callable[[str], bool]) -> None:
        """Return once no model in `deps` is loading (deps that wait on `name` themselves are not waited for)."""
        deps = {d for d in deps if d != name and not self._waits_on(d, name, set())}
        self._waiting[name] = deps
        try:
            while any(loading(d) for d in deps):
                future = asyncio.get_running_loop().create_future()
                self._waiters.append(future)
                await future
        finally:
            self._waiting.pop(name, None)

    def _waits_on(self, who: str, target: str, seen: set[str]) -> bool:
        if who in seen:
            return False
        seen.add(who)
        deps = self._waiting.get(who, set())
        return target in deps or any(self._waits_on(d, target, seen) for d in deps)

    def notify(self) -> None:
        """A model finished loading (or failed): waiters re-check."""
        waiters, self._waiters = self._waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(None)
