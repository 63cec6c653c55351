"""Runs the InferRequests of one OpenAI request (one per choice) through the engine and yields their chunks.

Every response arrives on the event loop through the engine's callback; chunks of all choices come out in arrival
order, tagged with their choice index. Stop strings and max_tokens a model does not apply itself end a choice
here (limits.py), which cancels its request in the model. Leaving the iteration early (the client went away:
the handler task is cancelled) cancels every unfinished request in the model, so a Python model sees
`is_cancelled()`. The token metrics (time to first token, inter-token latency, tokens) are recorded here, per
model.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field, replace

from service.core.engine import Engine
from service.core.observability.llm_metrics import ModelTokenStats
from service.core.repository.repository import ModelVersion
from service.frontend.openai.convert import Chunk, Contract, GenerationParams, parse
from service.frontend.openai.limits import Limits
from service.types import InferRequest, InferResponse


@dataclass(slots=True)
class ChoiceState:
    """What a choice has produced so far."""

    text: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int = 0  # the model's counts when it reports them, else one per text chunk
    reported_tokens: bool = False
    logprobs: list = field(default_factory=list)
    last_token_ns: int = 0
    closed: bool = False  # final response seen, or ended here (a limit, a client gone): later responses dropped


class Generation:
    """The choices of one request in flight."""

    def __init__(
        self,
        engine: Engine,
        model: str,
        requests: list[InferRequest],
        stats: ModelTokenStats,
        fanout: int = 1,
        limits: list[Limits | None] | None = None,
    ) -> None:
        self.engine = engine
        self.fanout = fanout  # choices per prompt (n): they share one prompt in the usage
        self.model = model
        self.requests = requests
        self.stats = stats
        self.choices = [ChoiceState() for _ in requests]
        self.limits = limits or [None] * len(requests)
        self.start_ns = time.monotonic_ns()
        self._queue: asyncio.Queue[tuple[int, InferResponse]] = asyncio.Queue()
        self._versions: list[ModelVersion] = []
        self._open = 0

    def start(self) -> None:
        """Submit every choice; a choice that cannot be submitted cancels the ones already running and raises."""
        try:
            for index, req in enumerate(self.requests):
                self._versions.append(self.engine.submit(req, self._deliver(index)))
                self._open += 1
        except BaseException:
            self.cancel()
            raise

    def _deliver(self, index: int) -> Callable[[InferResponse], None]:
        put = self._queue.put_nowait
        return lambda response: put((index, response))

    def _close(self, index: int, cancel: bool) -> None:
        state = self.choices[index]
        if not state.closed:
            state.closed = True
            self._open -= 1
            if cancel:
                self.engine.cancel(self.requests[index], self._versions[index])

    def cancel(self) -> None:
        """Stop every unfinished choice in the model (idempotent)."""
        for index in range(len(self._versions)):
            self._close(index, cancel=True)

    async def chunks(self) -> AsyncGenerator[tuple[int, Chunk], None]:
        """(choice index, chunk) until every choice ended; raises a model error."""
        try:
            while self._open:
                index, response = await self._queue.get()
                state = self.choices[index]
                if state.closed or (response.null and not response.final):
                    continue
                if response.final:
                    self._close(index, cancel=False)
                chunk = Chunk(final=True) if response.null else parse(response)
                limits = self.limits[index]
                if limits is not None:
                    chunk.text, ended = limits.feed(chunk.text)
                    if chunk.final:
                        chunk.text += limits.flush()
                    elif ended:  # a stop string or max_tokens: the model stops here
                        chunk.final = True
                        self._close(index, cancel=True)
                self._record(state, chunk)
                yield index, chunk
        finally:
            if self._open:
                self.cancel()
            else:
                self.stats.requests += 1

    def _record(self, state: ChoiceState, chunk: Chunk) -> None:
        now = time.monotonic_ns()
        stats = self.stats
        if chunk.text:
            if state.last_token_ns:
                stats.inter_token_latency.observe(now - state.last_token_ns)
            else:
                stats.time_to_first_token.observe(now - self.start_ns)
            state.last_token_ns = now
            state.text.append(chunk.text)
        if chunk.prompt_tokens is not None and state.prompt_tokens is None:
            state.prompt_tokens = chunk.prompt_tokens
            stats.prompt_tokens += chunk.prompt_tokens
        if chunk.completion_tokens is not None:
            state.reported_tokens = True
            state.completion_tokens += chunk.completion_tokens
            stats.generated_tokens += chunk.completion_tokens
        elif chunk.text and not state.reported_tokens:
            state.completion_tokens += 1
            stats.generated_tokens += 1
        if chunk.logprobs:
            state.logprobs.extend(chunk.logprobs)

    def usage(self) -> dict[str, int] | None:
        """OpenAI usage over all choices, when the model reported its prompt tokens (as Triton's front end)."""
        prompts = [c.prompt_tokens for c in self.choices]
        if any(p is None for p in prompts):
            return None
        prompt = sum(p or 0 for p in prompts) // max(1, self.fanout)
        completion = sum(c.completion_tokens for c in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def launch(engine: Engine, contract: Contract, prompts: list[GenerationParams], n: int, prefix: str) -> Generation:
    """Start n choices per prompt (choice index = prompt * n + j); choice j > 0 gets seed + j when a seed is set."""
    requests, limits = [], []
    for p, params in enumerate(prompts):
        for j in range(n):
            choice = params if j == 0 or params.seed is None else replace(params, seed=params.seed + j)
            requests.append(contract.request(choice, f"{prefix}-{p * n + j}"))
            limits.append(contract.limits(choice))
    stats = engine.llm_metrics.model(contract.name)
    generation = Generation(engine, contract.name, requests, stats, n, limits)
    generation.start()
    return generation
