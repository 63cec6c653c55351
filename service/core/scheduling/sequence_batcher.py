"""Triton's sequence batcher (docs/streaming.md): sequences pinned to instance slots, direct and oldest strategies.

Every live sequence holds a slot of one model instance, so all its requests run on that instance, in order.
New sequences take a free slot or wait in a FIFO backlog. `direct`: an execution takes the next request of
every slot of the instance, filling idle slots below the highest busy one with null requests (READY=false,
responses discarded). `oldest`: an execution takes the oldest next-requests of the instance's candidate
sequences, at most one per sequence, batched like the dynamic batcher (preferred sizes, queue delay).
Control tensors and implicit state are injected into each request as it is dispatched; an idle reaper frees
the slots of sequences not heard from for `max_sequence_idle_microseconds`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import OrderedDict, deque
from functools import partial
from typing import Any

from protos import model_config_pb2 as mc
from service.core.observability.stats import ModelStats
from service.core.scheduling.implicit_state import SequenceState, build_states
from service.core.scheduling.scheduler import InstanceScheduler
from service.core.scheduling.sequence_controls import build_controls
from service.errors import ErrorCode, ServiceError
from service.instances.pool import InstancePool
from service.instances.process import WorkerProcess
from service.types import FLAG_SEQUENCE_END, FLAG_SEQUENCE_START, InferRequest, InferResponse, RequestedOutput

log = logging.getLogger("trireme.sequence")


class _Sequence:
    """One live (or backlogged) sequence."""

    __slots__ = ("id", "inflight", "instance", "last_ns", "queue", "slot", "state")

    def __init__(self, sequence_id: int | str, state: SequenceState | None) -> None:
        self.id = sequence_id
        self.queue: deque[InferRequest] = deque()
        self.instance = ""  # instance name, "" while backlogged
        self.slot = -1
        self.last_ns = 0
        self.inflight = 0
        self.state = state


class _Instance:
    """The slots of one model instance."""

    __slots__ = ("name", "slots")

    def __init__(self, name: str, slot_count: int) -> None:
        self.name = name
        self.slots: list[_Sequence | None] = [None] * slot_count


def _prefix(request: InferRequest) -> str:
    return f"[request id: {request.id or '<id_unknown>'}] "


class SequenceBatcher(InstanceScheduler):
    """Scheduler for models with `sequence_batching` (direct or oldest strategy)."""

    def __init__(self, pool: InstancePool, stats: ModelStats, config: mc.ModelConfig, model_dir: str) -> None:
        super().__init__(pool, stats)
        sb = config.sequence_batching
        self.model_name = config.name
        self.max_batch_size = config.max_batch_size
        self.oldest = sb.HasField("oldest")
        self.controls = build_controls(config)
        self.states = build_states(config, model_dir)
        self.output_names = [o.name for o in config.output]
        self.idle_ns = (sb.max_sequence_idle_microseconds or 1_000_000) * 1000
        # iterative sequences (Triton's IterativeSequencer): a request without a correlation ID is a sequence of
        # its own, a request the model releases for rescheduling runs again in it, and its final ends it
        self.iterative = sb.iterative_sequence
        self._own_ids = itertools.count(1 << 62)  # far from the IDs clients choose
        if self.oldest:
            slots = sb.oldest.max_candidate_sequences or max(1, config.max_batch_size)
            self.preferred = sorted(set(sb.oldest.preferred_batch_size))
            self.delay_ns = sb.oldest.max_queue_delay_microseconds * 1000
        else:
            slots = max(1, config.max_batch_size)
            self.preferred = []
            self.delay_ns = 0
        self.slot_count = slots
        self.instances = {w.spec.instance_name: _Instance(w.spec.instance_name, slots) for w in pool.workers}
        self._leaving: dict[str, asyncio.Future[None]] = {}  # instances an update removes -> "slots empty"
        self.sequences: dict[int | str, _Sequence] = {}
        self.backlog: OrderedDict[int | str, _Sequence] = OrderedDict()
        self._reaper: asyncio.TimerHandle | None = None
        self._delay_timer: asyncio.TimerHandle | None = None

    # ---- admission --------------------------------------------------------------------------------------
    def enqueue(self, request: InferRequest) -> None:
        sid = request.sequence_id
        if (sid == 0 or sid == "") and self.iterative:
            request.sequence_id = sid = next(self._own_ids)
            request.flags |= FLAG_SEQUENCE_START
        elif sid == 0 or sid == "":
            raise ServiceError(
                ErrorCode.INVALID_ARG,
                _prefix(request) + f"inference request to model '{self.model_name}' must specify a non-zero or "
                "non-empty correlation ID",
            )
        if self.max_batch_size > 0 and request.batch_size != 1:
            raise ServiceError(
                ErrorCode.INVALID_ARG,
                _prefix(request) + f"inference request to model '{self.model_name}' must specify batch-size 1 due "
                "to requirements of sequence batcher",
            )
        seq = self.sequences.get(sid) or self.backlog.get(sid)
        if seq is None:
            if not request.flags & FLAG_SEQUENCE_START:
                raise ServiceError(
                    ErrorCode.INVALID_ARG,
                    _prefix(request) + f"inference request for sequence {sid} to model '{self.model_name}' must "
                    "specify the START flag on the first request of the sequence",
                )
            seq = _Sequence(sid, SequenceState(self.states, self.max_batch_size > 0) if self.states else None)
            if not self._assign(seq):
                self.backlog[sid] = seq
        elif request.flags & FLAG_SEQUENCE_START:
            log.warning(
                "sequence %s to model '%s' got a new START: the previous sequence ends early", sid, self.model_name
            )
        self.track(request)
        seq.queue.append(request)
        seq.last_ns = time.monotonic_ns()
        self._arm_reaper()
        self._pump()

    def pending_count(self) -> int:
        queued = sum(len(s.queue) for s in self.sequences.values()) + sum(len(s.queue) for s in self.backlog.values())
        return queued + self.handed_over_count()

    def _assign(self, seq: _Sequence) -> bool:
        """Give `seq` a free slot (spreading sequences over instances); False when every slot is taken."""
        instances = [inst for inst in self.instances.values() if inst.name not in self._leaving]
        for index in range(len(instances[0].slots) if instances else 0):
            for inst in instances:
                if inst.slots[index] is None:
                    inst.slots[index] = seq
                    seq.instance, seq.slot = inst.name, index
                    self.sequences[seq.id] = seq
                    return True
        return False

    def _release(self, seq: _Sequence) -> None:
        """Free `seq`'s slot and hand it to the oldest backlogged sequence."""
        inst = self.instances.get(seq.instance)
        if self.sequences.get(seq.id) is seq:
            del self.sequences[seq.id]
        if inst is None or inst.slots[seq.slot] is not seq:
            return
        slot = seq.slot
        inst.slots[slot] = None
        seq.instance, seq.slot = "", -1
        leaving = self._leaving.get(inst.name)
        if leaving is not None:  # an instance being removed takes no new sequence
            if all(s is None for s in inst.slots) and not leaving.done():
                leaving.set_result(None)
            return
        if self.backlog:
            _, waiting = self.backlog.popitem(last=False)
            inst.slots[slot] = waiting
            waiting.instance, waiting.slot = inst.name, slot
            self.sequences[waiting.id] = waiting
            waiting.last_ns = time.monotonic_ns()

    # ---- instance-count updates --------------------------------------------------------------------------
    def add_worker(self, worker: WorkerProcess) -> None:
        """A new instance: its slots take backlogged sequences at once."""
        inst = self.instances[worker.spec.instance_name] = _Instance(worker.spec.instance_name, self.slot_count)
        for index in range(len(inst.slots)):
            if not self.backlog:
                break
            _, waiting = self.backlog.popitem(last=False)
            inst.slots[index] = waiting
            waiting.instance, waiting.slot = inst.name, index
            self.sequences[waiting.id] = waiting
            waiting.last_ns = time.monotonic_ns()
        self._on_available(worker)

    async def release_worker(self, worker: WorkerProcess, timeout_s: float) -> None:
        """An instance leaves: it takes no new sequence; its live sequences run to their end (or idle timeout)."""
        name = worker.spec.instance_name
        inst = self.instances.get(name)
        if inst is not None and any(s is not None for s in inst.slots):
            done = self._leaving[name] = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(asyncio.shield(done), timeout_s)
            except TimeoutError:
                live = [s for s in inst.slots if s is not None]
                log.warning(
                    "instance '%s' of model '%s' is removed with %d sequence(s) still live after %g s",
                    name,
                    self.model_name,
                    len(live),
                    timeout_s,
                )
                for seq in live:
                    self._release(seq)
        self._leaving.pop(name, None)
        self.instances.pop(name, None)
        self._on_lost(worker)

    # ---- batching ---------------------------------------------------------------------------------------
    def _next_batch(self) -> list[InferRequest] | None:
        return None  # batches are per instance: see _pump

    def _pump(self) -> None:
        for worker in list(self.idle):
            inst = self.instances.get(worker.spec.instance_name)
            if inst is None:
                continue
            batch = self._oldest_batch(inst) if self.oldest else self._direct_batch(inst)
            if batch:
                self.idle.remove(worker)
                self._dispatch(worker, batch)

    @staticmethod
    def _head(seq: _Sequence | None) -> InferRequest | None:
        if seq is None:
            return None
        queue = seq.queue
        while queue and queue[0].cancelled:
            queue.popleft()
        return queue[0] if queue else None

    def _direct_batch(self, inst: _Instance) -> list[InferRequest] | None:
        picked: dict[int, tuple[InferRequest, _Sequence]] = {}
        for index, seq in enumerate(inst.slots):
            head = self._head(seq)
            if head is not None and seq is not None:
                picked[index] = (seq.queue.popleft(), seq)
        if not picked:
            return None
        template = next(iter(picked.values()))[0]
        template_inputs = list(template.inputs)
        batch = []
        for index in range(max(picked) + 1):
            entry = picked.get(index)
            if entry is None:
                batch.append(self._null_request(template, template_inputs))
            else:
                batch.append(self._prepare(*entry))
        return batch

    def _oldest_batch(self, inst: _Instance) -> list[InferRequest] | None:
        heads = []
        for seq in inst.slots:
            head = self._head(seq)
            if head is not None and seq is not None:
                heads.append((head.arrival_ns, seq))
        if not heads:
            return None
        heads.sort(key=lambda h: h[0])
        limit = max(1, self.max_batch_size)
        heads = heads[:limit]
        if len(heads) < limit and len(heads) not in self.preferred and self.delay_ns > 0:
            waited = time.monotonic_ns() - heads[0][0]
            if waited < self.delay_ns:
                self._arm_delay(self.delay_ns - waited)
                return None
        return [self._prepare(seq.queue.popleft(), seq) for _, seq in heads]

    def _arm_delay(self, remaining_ns: int) -> None:
        if self._delay_timer is None:
            self._delay_timer = self._loop_call_later(remaining_ns / 1e9, self._on_delay)

    def _on_delay(self) -> None:
        self._delay_timer = None
        self._pump()

    def _loop_call_later(self, delay_s: float, callback: Any) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(delay_s, callback)

    # ---- per-request preparation ------------------------------------------------------------------------
    def _prepare(self, request: InferRequest, seq: _Sequence) -> InferRequest:
        """Inject control tensors and state, and release the slot after an END request."""
        start = bool(request.flags & FLAG_SEQUENCE_START)
        end = bool(request.flags & FLAG_SEQUENCE_END)
        extra = self.controls.tensors(start, end, True, seq.id)
        state = seq.state
        if state is not None:
            if start:
                state.reset()
            extra += state.inputs()
            if not request.outputs:
                request.outputs = [RequestedOutput(n) for n in self.output_names]
            request.outputs = request.outputs + [RequestedOutput(s.output_name) for s in state.specs]
        if self.iterative:  # what it is taken back with when the model reschedules it
            request.on_reschedule = partial(self._reschedule, seq, request.on_response, request.inputs, request.outputs)
        request.inputs = request.inputs + extra
        seq.inflight += 1
        self._wrap(request, seq)
        if end and not seq.queue:
            self._release(seq)
        return request

    def _wrap(self, request: InferRequest, seq: _Sequence) -> None:
        deliver = request.on_response
        state = seq.state
        iterative = self.iterative

        def on_response(response: InferResponse) -> None:
            if state is not None and response.outputs:
                response.outputs = state.capture(response.outputs)
            if response.final:
                seq.inflight -= 1
                seq.last_ns = time.monotonic_ns()
                if iterative and not seq.queue and not seq.inflight:  # its request is done: so is the sequence
                    self._release(seq)
            if deliver is not None:
                deliver(response)

        request.on_response = on_response

    def _reschedule(
        self,
        seq: _Sequence,
        deliver: Any,
        inputs: list[Any],
        outputs: list[RequestedOutput],
        request: InferRequest,
    ) -> None:
        """The model released `request` for rescheduling: it runs again in its sequence, neither START nor END
        (as Triton's), with the inputs the client sent."""
        seq.inflight -= 1
        request.inputs, request.outputs, request.flags = inputs, outputs, 0
        request.on_response, request.on_reschedule = deliver, None
        if self.sequences.get(seq.id) is not seq and self.backlog.get(seq.id) is not seq and not self._assign(seq):
            self.backlog[seq.id] = seq  # its slot went meanwhile (an instance update): it waits for one
        seq.queue.append(request)
        seq.last_ns = time.monotonic_ns()
        self._pump()

    def _null_request(self, template: InferRequest, inputs: list[Any]) -> InferRequest:
        """A filler for an idle slot: the template's inputs with READY=false; its responses are dropped."""
        null = InferRequest(template.model_name, template.model_version, "", outputs=list(template.outputs))
        null.batch_size = 0  # not counted as an inference
        null.arrival_ns = template.arrival_ns
        null.sequence_id = "" if isinstance(template.sequence_id, str) else 0
        null.inputs = inputs + self.controls.tensors(False, False, False, null.sequence_id)
        if self.states:
            null.inputs += SequenceState(self.states, self.max_batch_size > 0).inputs()
        return null

    # ---- idle sequences -----------------------------------------------------------------------------------
    def _arm_reaper(self) -> None:
        if self._reaper is None and self.sequences:
            self._reaper = self._loop_call_later(self.idle_ns / 1e9, self._reap)

    def _reap(self) -> None:
        self._reaper = None
        now = time.monotonic_ns()
        next_due = None
        for seq in list(self.sequences.values()):
            if seq.queue or seq.inflight:
                continue
            due = seq.last_ns + self.idle_ns
            if due <= now:
                log.warning(
                    "sequence %s to model '%s' was idle for more than %d us: its slot is released",
                    seq.id,
                    self.model_name,
                    self.idle_ns // 1000,
                )
                self._release(seq)
            elif next_due is None or due < next_due:
                next_due = due
        if self.sequences:
            delay = (next_due - now) / 1e9 if next_due is not None else self.idle_ns / 1e9
            self._reaper = self._loop_call_later(max(delay, 0.001), self._reap)
        self._pump()

    # ---- cancellation and shutdown --------------------------------------------------------------------
    def cancel(self, request: InferRequest) -> None:
        seq = self.sequences.get(request.sequence_id) or self.backlog.get(request.sequence_id)
        if seq is not None and request in seq.queue:
            seq.queue.remove(request)
            self.stats.cancelled += 1
            self.reject(request, ErrorCode.CANCELLED, "request cancelled by the client")
            return
        self.cancel_running(request)

    async def stop(self) -> None:
        for timer in (self._reaper, self._delay_timer):
            if timer is not None:
                timer.cancel()
        self._reaper = self._delay_timer = None
