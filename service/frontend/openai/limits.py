"""Stop strings and max_tokens that a model does not apply itself, applied here to the text it streams.

A model without a `stop_words` input gets its text cut at the first stop string (text that may be the start of
one is held back until it is known not to be); a model without a `max_tokens` input is asked to stream, and
its generation ends after `max_tokens` text responses. Either way the request is then cancelled in the model.
"""

from __future__ import annotations


class Limits:
    """One choice's limits."""

    def __init__(self, stop: list[str], max_chunks: int | None) -> None:
        self.stop = [s for s in stop if s]
        self.max_chunks = max_chunks
        self.held = ""
        self.chunks = 0

    def feed(self, text: str) -> tuple[str, bool]:
        """(text to send now, whether the generation ends here)."""
        if text:
            self.chunks += 1
        ended = self.max_chunks is not None and self.chunks >= self.max_chunks
        if not self.stop:
            return text, ended
        buffer = self.held + text
        at = min((i for s in self.stop if (i := buffer.find(s)) >= 0), default=-1)
        if at >= 0:
            self.held = ""
            return buffer[:at], True
        if ended:
            self.held = ""
            return buffer, True
        # hold back the longest tail that could begin a stop string
        keep = max((k for s in self.stop for k in range(1, len(s)) if buffer.endswith(s[:k])), default=0)
        self.held = buffer[len(buffer) - keep :]
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        """What is held back, at the model's own end of the generation."""
        held, self.held = self.held, ""
        return held
