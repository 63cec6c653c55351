"""What every front end started from Python shares: attach to a started server, start once, stop, and be a
context manager (Triton's tritonfrontend classes behave the same way)."""

from __future__ import annotations

from typing import Any

from trireme._core.runtime import CoreRuntime
from trireme.tritonserver._errors import InvalidArgumentError, UnavailableError


class Frontend:
    """One listener over a started trireme.tritonserver.Server; `port` is the bound port once started."""

    Options: Any = None
    _kind = "front end"

    def __init__(self, server: Any, options: Any = None) -> None:
        if options is None:
            options = self.Options()
        if not isinstance(options, self.Options):
            name = type(self).__name__
            raise InvalidArgumentError(f"Incorrect type for options. options argument must be of type {name}.Options")
        self._runtime: CoreRuntime = server._ptr()
        self.options = options
        self.port = 0
        self._listener: Any = None

    async def _start(self, runtime: CoreRuntime) -> tuple[Any, int]:
        """Start the listener on the core's loop: (listener, bound port)."""
        raise NotImplementedError

    async def _stop(self, listener: Any) -> None:
        raise NotImplementedError

    def start(self) -> None:
        if self._listener is not None:
            raise InvalidArgumentError(f"{self._kind} is already started")
        if self._runtime.core is None:
            raise InvalidArgumentError("Server not started")
        try:
            self._listener, self.port = self._runtime.run(self._start(self._runtime))
        except OSError as e:
            raise UnavailableError(
                f"failed to start {self._kind} at {self.options.address}:{self.options.port}: {e}"
            ) from None
        self._runtime.add_closer(self._close)

    async def _close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            await self._stop(listener)

    def stop(self) -> None:
        """Stop listening (requests in flight finish); does nothing when not started or when the server stopped."""
        if self._listener is None:
            return
        self._runtime.remove_closer(self._close)
        if self._runtime.core is None:  # Server.stop() already closed it
            self._listener = None
            return
        self._runtime.run(self._close())

    def __enter__(self) -> Frontend:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
