"""The route table: paths with `{name}` / `{name:regex}` parts, each mapped to one handler, matched in order."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

from service.frontend.http.message import Request, Response, Stream

Handler = Callable[[Request], Awaitable[Response | Stream]]

_PART = re.compile(r"\{(\w+)(?::([^{}]+))?\}")


def compile_path(path: str) -> re.Pattern[str]:
    """`/v2/models/{model}/versions/{version:[0-9]+}` as an anchored regex with named groups."""
    out, pos = [], 0
    for m in _PART.finditer(path):
        out.append(re.escape(path[pos : m.start()]))
        out.append(f"(?P<{m.group(1)}>{m.group(2) or '[^{}/]+'})")
        pos = m.end()
    out.append(re.escape(path[pos:]))
    return re.compile("".join(out) + r"\Z")


class Router:
    """Fixed paths in a dict, the others tried in the order they were added; a path that matched a pattern is
    remembered (up to CACHED paths, then the memory starts over), so a model's infer path is one dict lookup."""

    CACHED = 1024

    def __init__(self) -> None:
        self._fixed: dict[str, Handler] = {}
        self._patterns: list[tuple[re.Pattern[str], Handler]] = []
        self._matched: dict[str, tuple[Handler, dict[str, str]]] = {}

    def add(self, path: str, handler: Handler) -> None:
        if "{" not in path:
            self._fixed.setdefault(path, handler)
        else:
            self._patterns.append((compile_path(path), handler))
        self._matched.clear()

    def resolve(self, path: str) -> tuple[Handler, dict[str, str]] | None:
        """The handler of a path and the path's parts; None when no route matches."""
        handler = self._fixed.get(path)
        if handler is not None:
            return handler, {}
        known = self._matched.get(path)
        if known is not None:
            return known[0], dict(known[1])  # each request its own match_info
        for pattern, handler in self._patterns:
            m = pattern.match(path)
            if m is not None:
                parts = m.groupdict()
                if len(self._matched) >= self.CACHED:
                    self._matched.clear()
                self._matched[path] = (handler, dict(parts))
                return handler, parts
        return None
