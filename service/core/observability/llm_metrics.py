"""Per-model token metrics of generation requests (the OpenAI front end records them; docs/metrics.md).

Time to first token and inter-token latency histograms, tokens generated and prompt tokens, per model. Like the
core's counters, recording only bumps plain ints on the event loop; a scrape builds the families.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric

from service.core.observability.metrics import add_histogram
from service.core.observability.stats import LatencyHistogram


@dataclass(slots=True)
class ModelTokenStats:
    """One model's generation counters."""

    time_to_first_token: LatencyHistogram = field(default_factory=LatencyHistogram)
    inter_token_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    generated_tokens: int = 0
    prompt_tokens: int = 0
    requests: int = 0


class LlmMetrics:
    """A prometheus_client Collector of ModelTokenStats by model name."""

    def __init__(self) -> None:
        self.models: dict[str, ModelTokenStats] = {}

    def model(self, name: str) -> ModelTokenStats:
        """The stats of `name`, created on first use."""
        stats = self.models.get(name)
        if stats is None:
            stats = self.models[name] = ModelTokenStats()
        return stats

    def collect(self) -> Iterator[Metric]:
        """The token families (nothing before the first generation request)."""
        rows = sorted(self.models.items())
        for name, doc, attr in (
            ("trireme_time_to_first_token_seconds", "Time from a generation request's arrival to its first "
             "generated text, in seconds", "time_to_first_token"),
            ("trireme_inter_token_latency_seconds", "Time between successive generated text chunks of a streamed "
             "generation request, in seconds", "inter_token_latency"),
        ):  # fmt: skip
            m = Metric(name, doc, "histogram")
            for model, stats in rows:
                add_histogram(m, {"model": model}, getattr(stats, attr))
            yield m
        for name, doc, attr in (
            ("trireme_generated_tokens_total", "Tokens generated (the model's num_output_tokens, else one per text "
             "chunk)", "generated_tokens"),
            ("trireme_prompt_tokens_total", "Prompt tokens of generation requests (as the model reports them)",
             "prompt_tokens"),
            ("trireme_generation_requests_total", "Generation requests answered (chat and text completions)",
             "requests"),
        ):  # fmt: skip
            m = Metric(name, doc, "counter")
            for model, stats in rows:
                m.add_sample(name, {"model": model}, getattr(stats, attr))
            yield m
