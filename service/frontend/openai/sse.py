"""Server-sent events as OpenAI streams them: `data: <json>\\n\\n` per chunk, `data: [DONE]\\n\\n` at the end."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from service.frontend.openai.errors import OpenAIError

DONE = b"data: [DONE]\n\n"


class EventStream:
    """The response of a streamed request, opened at its first event (an error before it is a plain JSON error)."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response: web.StreamResponse | None = None

    async def _open(self) -> web.StreamResponse:
        if self.response is None:
            response = web.StreamResponse(status=200, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            response.content_type = "text/event-stream"
            response.charset = "utf-8"
            await response.prepare(self.request)
            self.response = response
        return self.response

    async def send(self, event: dict[str, Any]) -> None:
        """One chunk."""
        await (await self._open()).write(b"data: " + orjson.dumps(event) + b"\n\n")

    async def error(self, err: OpenAIError) -> None:
        """An error after the stream opened: an `error` event (the stream then ends with [DONE])."""
        await self.send(err.body())

    async def done(self) -> web.StreamResponse:
        """`data: [DONE]` and the end of the response."""
        response = await self._open()
        await response.write(DONE)
        await response.write_eof()
        return response
