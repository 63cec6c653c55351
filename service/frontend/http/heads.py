"""The heads of HTTP/1.1 responses: status lines and Content-Type lines made once, the Date header once a second,
a whole head in one formatting step (h1.py writes it together with the body)."""

from __future__ import annotations

import time
from email.utils import formatdate
from http import HTTPStatus
from typing import ClassVar

_STATUS_LINES = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in HTTPStatus}
_TYPE_LINES: dict[str, bytes] = {}  # "Content-Type: ...\r\n" of the content types answered so far
_TYPE_LINES_MAX = 64  # handlers answer a handful of types; any beyond this are formatted each time
_HEAD = b"%s%sContent-Length: %d\r\nDate: %s\r\n%s\r\n"
_STREAM_HEAD = b"%s%sDate: %s\r\n%s\r\n"


class _Date:
    """The Date header, formatted once a second."""

    second: ClassVar[int] = 0
    value: ClassVar[bytes] = b""

    @classmethod
    def get(cls) -> bytes:
        now = int(time.time())
        if now != cls.second:
            cls.second, cls.value = now, formatdate(now, usegmt=True).encode()
        return cls.value


def status_line(status: int) -> bytes:
    """`HTTP/1.1 200 OK\\r\\n` (an unknown code's reason is "Unknown")."""
    return _STATUS_LINES.get(status) or b"HTTP/1.1 %d Unknown\r\n" % status


def content_type_line(content_type: str) -> bytes:
    """`Content-Type: ...\\r\\n`; empty for no content type."""
    if not content_type:
        return b""
    line = _TYPE_LINES.get(content_type)
    if line is None:
        line = b"Content-Type: %s\r\n" % content_type.encode()
        if len(_TYPE_LINES) < _TYPE_LINES_MAX:
            _TYPE_LINES[content_type] = line
    return line


def response_head(status: int, content_type: str, headers: dict[str, str], length: int, connection: bytes) -> bytes:
    """A whole response's head: status, Content-Type, the handler's headers, Content-Length, Date, then the
    `connection` line(s) as given, and the blank line."""
    extra = content_type_line(content_type)
    for name, value in headers.items():
        extra += b"%s: %s\r\n" % (name.encode(), value.encode())
    return _HEAD % (status_line(status), extra, length, _Date.get(), connection)


def stream_head(status: int, content_type: str, coding: bytes) -> bytes:
    """A streamed response's head: status, Content-Type, Date, then `coding` (chunked, or Connection: close)."""
    return _STREAM_HEAD % (status_line(status), content_type_line(content_type), _Date.get(), coding)
