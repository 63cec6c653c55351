"""Test helper: scrape a server's /metrics and index the samples with prometheus_client's parser."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


class Scrape:
    """One parsed scrape: value(name, **labels) for counters/gauges (Triton names, no `_total`) and samples."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}

    def value(self, name: str, **labels: str) -> float:
        """The value of the sample `name` (a family name, or a histogram's name_bucket/_count/_sum) with labels."""
        matches = [
            s.value
            for f in self.families.values()
            for s in f.samples
            if s.name in (name, name + "_total") and all(s.labels.get(k) == v for k, v in labels.items())
        ]
        assert len(matches) == 1, f"{len(matches)} samples of {name}{labels} in:\n{self.text}"
        return float(matches[0])

    def has(self, name: str) -> bool:
        """Whether a family of this name is exported."""
        return name in self.families


def scrape(url: str) -> Scrape:
    """GET the metrics URL (ServerProcess.metrics_url) and parse it."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
        return Scrape(response.read().decode())
