"""trireme.Server: a tritonserver.Server that serves Python functions (`bind`, PyTriton's signature), starts
its HTTP, gRPC, metrics (and optionally OpenAI) front ends, and is a context manager, plain or async, inside a
notebook's running event loop or outside one."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Sequence
from typing import Any

from trireme.bind.spec import ModelConfig, Tensor
from trireme.bind.worker import LOCAL
from trireme.bind.writer import check_declaration, write_model
from trireme.tritonfrontend import KServeGrpc, KServeHttp, Metrics, OpenAI
from trireme.tritonserver import AlreadyExistsError, InvalidArgumentError, Options
from trireme.tritonserver import Server as TritonServer


class Server(TritonServer):
    """An in-process server with front ends and bound functions.

    Ports: an int listens there (0 picks a free port, read back from `http_port` & co. once started), None
    leaves that front end off. Other keywords are tritonserver.Options fields (a model repository is optional);
    `config`: an object with PyTriton's TritonConfig fields http_port, grpc_port, metrics_port, http_address and
    model_repository (the others are not used).
    """

    def __init__(
        self,
        options: Options | None = None,
        *,
        http_port: int | None = 8000,
        grpc_port: int | None = 8001,
        metrics_port: int | None = 8002,
        openai_port: int | None = None,
        address: str = "0.0.0.0",
        config: Any = None,
        **kwargs: Any,
    ) -> None:
        if config is not None:  # PyTriton's Triton(config=TritonConfig(...)): its ports, address and repository
            ports = {"http_port": http_port, "grpc_port": grpc_port, "metrics_port": metrics_port}
            http_port, grpc_port, metrics_port = (getattr(config, k, None) or v for k, v in ports.items())
            address = getattr(config, "http_address", None) or address
            if getattr(config, "model_repository", None):
                kwargs.setdefault("model_repository", str(config.model_repository))
        super().__init__(options, **kwargs)
        self.address = address
        self._ports: dict[str, int | None] = {
            "http": http_port,
            "grpc": grpc_port,
            "metrics": metrics_port if self.options.metrics else None,
            "openai": openai_port,
        }
        self.http_port = self.grpc_port = self.metrics_port = self.openai_port = 0
        self._root = tempfile.mkdtemp(prefix="trireme-bound-")
        self._bound: dict[str, tuple[str, str]] = {}  # model name -> (folder, in-process token)
        self._pending: list[str] = []  # bound before start, loaded by start() in EXPLICIT mode
        self._serving = threading.Event()

    # ---- lifecycle -------------------------------------------------------------------------------------
    def _extra_repositories(self) -> list[str]:
        return [self._root]

    def _after_start(self) -> None:
        pending, self._pending = self._pending, []
        index = {m.name for m in self._model_index()}
        for name in pending:
            if name not in index or self._runtime_state(name) != "READY":
                self._load_bound(name)
        frontends = {"http": KServeHttp, "grpc": KServeGrpc, "metrics": Metrics, "openai": OpenAI}
        for kind, cls in frontends.items():
            port = self._ports[kind]
            if port is None:
                continue
            frontend = cls(self, cls.Options(address=self.address, port=port))
            frontend.start()  # stopped by Server.stop() (the runtime's closers)
            setattr(self, f"{kind}_port", frontend.port)

    def _runtime_state(self, name: str) -> str:
        states = [m.state for m in self._model_index() if m.name == name]
        return states[0] or "" if states else ""

    def stop(self) -> None:
        """Stop the front ends and every model (worker processes exit, shared memory is released)."""
        try:
            super().stop()
        finally:
            self._serving.set()
            for _folder, token in self._bound.values():
                LOCAL.pop(token, None)
            shutil.rmtree(self._root, ignore_errors=True)

    def run(self) -> Server:
        """Start without blocking (PyTriton's run())."""
        self.start()
        return self

    def serve(self) -> None:
        """Start (if needed) and block until Ctrl-C or stop() from another thread, then stop."""
        if self._runtime is None:
            self.start()
        try:
            while not self._serving.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def __enter__(self) -> Server:
        if self._runtime is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> Server:
        """`async with`: starts on a thread, so the caller's event loop keeps running meanwhile."""
        if self._runtime is None:
            await asyncio.to_thread(self.start)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)

    # ---- bound functions -------------------------------------------------------------------------------
    def bind(
        self,
        model_name: str,
        infer_func: Callable[..., Any] | Sequence[Callable[..., Any]],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        model_version: int = 1,
        config: ModelConfig | None = None,
        strict: bool = False,
        trace_config: list[str] | None = None,
        *,
        in_process: bool = False,
    ) -> None:
        """Serve `infer_func` as model `model_name` (PyTriton's bind). It gets a list of requests (mappings of
        input name to numpy array) and returns one dict of outputs per request; with @batch it gets the inputs
        stacked. A list of functions makes one instance each. It runs in worker processes (sent there pickled:
        docs/python-api.md), or on threads of this process with in_process=True. A running server loads it at
        once; errors: AlreadyExistsError for a name in use, InvalidArgumentError when it cannot be served."""
        functions: list[Callable[..., Any]] = (
            list(infer_func) if isinstance(infer_func, (list, tuple)) else [infer_func]  # type: ignore[list-item]
        )
        config = config or ModelConfig()
        try:
            ins, outs = check_declaration(model_name, functions, inputs, outputs)
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(str(e)) from None
        if model_name in self._bound or any(
            os.path.isdir(os.path.join(r, model_name)) for r in self.options.repositories()
        ):
            raise AlreadyExistsError(f"a model named '{model_name}' is already served by this server")
        if self._stopped:
            raise InvalidArgumentError("Server has been stopped; create a new Server to bind models")
        try:
            self._bound[model_name] = write_model(
                self._root, model_name, model_version, functions, ins, outs, config, strict, in_process
            )
        except TypeError as e:
            raise InvalidArgumentError(str(e)) from None
        if self._runtime is None:
            self._pending.append(model_name)
        else:
            self._load_bound(model_name)

    def _load_bound(self, name: str) -> None:
        """Load a bound function's model now; on failure forget it and raise why."""
        folder, token = self._bound[name]
        runtime = self._running()
        repository = runtime.engine.repository
        config_error, errors = runtime.run(repository.load(name, found_path=folder))
        if not config_error and not errors:
            return

        async def forget() -> None:
            await repository.unload(name)
            repository.models.pop(name, None)

        runtime.run(forget())
        del self._bound[name]
        LOCAL.pop(token, None)
        shutil.rmtree(folder, ignore_errors=True)
        reason = config_error or "; ".join(errors)
        raise InvalidArgumentError(f"failed to load bound model '{name}': {reason}")
