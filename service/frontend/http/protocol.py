"""aiohttp's connection handler with one fix: a request body that stops parsing fails the request reading it.

aiohttp queues a parse error in a request's body (say a malformed chunk extension that arrives in a later read
than the request's head) as a new message and never ends the body the running handler is reading, so that
request waits until the client goes away. Here the body gets the error (RequestPayloadError), and the handler
answers 400 at once."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler, RequestPayloadError


class _Handler(RequestHandler):
    _open_body: StreamReader | None = None  # the body of the last request whose head was parsed

    def data_received(self, data: bytes) -> None:
        queued = len(self._messages)
        super().data_received(data)
        for message, payload in list(self._messages)[queued:]:
            if isinstance(message, RawRequestMessage):
                self._open_body = payload
                continue
            body, self._open_body = self._open_body, None  # a parse error (aiohttp's _ErrInfo) after that head
            if body is not None and not body.is_eof():
                body.set_exception(RequestPayloadError(" ".join(str(getattr(message, "message", "")).split())))


class _Server(web.Server):
    def __call__(self) -> RequestHandler:
        return _Handler(self, loop=self._loop, **self._kwargs)


def use_failing_payloads(runner: Any) -> None:
    """After runner.setup(): its connections use _Handler."""
    server = runner.server
    if type(server) is web.Server:
        server.__class__ = _Server
