"""tritonserver.Server: an in-process server with Triton's methods. Its core (service/server.py: repository,
engine, worker processes) runs on a private event-loop thread; every method is a blocking call into it."""

from __future__ import annotations

import time
from typing import Any

from service.errors import ServiceError
from service.frontend.metrics import render
from trireme._core.runtime import CoreRuntime, parse_flags
from trireme.tritonserver._enums import MetricFormat
from trireme.tritonserver._errors import InvalidArgumentError, UnavailableError, UnsupportedError, from_service
from trireme.tritonserver._model import Model
from trireme.tritonserver._options import Options


class ModelDictionary(dict):
    """(name, version) -> Model; indexing by a name alone gives that model at version -1."""

    def __init__(self, server: Server, models: list[Model]) -> None:
        super().__init__()
        for model in models:
            self[(model.name, model.version)] = model
        self._server = server
        self._model_names = [key[0] for key in self.keys()]

    def __getitem__(self, key: Any) -> Model:
        if isinstance(key, tuple):
            try:
                return dict.__getitem__(self, key)
            except KeyError:
                raise KeyError(f"Unknown Model: {key}") from None
        if key in self._model_names:
            return Model(self._server, name=key, version=-1)
        raise KeyError(f"Unknown Model: {key}")


class Server:
    """An in-process inference server (Triton's tritonserver.Server)."""

    def __init__(self, options: Options | None = None, **kwargs: Any) -> None:
        if options is None:
            options = Options(**kwargs)
        self.options: Options = options
        self._runtime: CoreRuntime | None = None
        self._stopped = False

    # ---- lifecycle ---------------------------------------------------------------------------------------
    def _extra_repositories(self) -> list[str]:
        """Repositories a subclass adds to the options' (trireme.Server's bound functions)."""
        return []

    def _after_start(self) -> None:
        """Called once the core runs (trireme.Server loads its bound functions here)."""

    def start(
        self, wait_until_ready: bool = False, polling_interval: float = 0.1, timeout: float | None = None
    ) -> Server:
        """Start the server and load the models its control mode asks for."""
        if self._runtime is not None:
            raise InvalidArgumentError("Server already started")
        if self._stopped:
            raise InvalidArgumentError("Server has been stopped; create a new Server to start again")
        try:
            config = parse_flags(self.options.to_flags(self._extra_repositories()))
            runtime = CoreRuntime(config)
            runtime.start()
        except ServiceError as e:
            raise from_service(e) from None
        self._runtime = runtime
        try:
            self._after_start()
        except BaseException:
            self.stop()
            raise
        start = time.monotonic()
        while wait_until_ready and not self.ready() and (timeout is None or time.monotonic() - start < timeout):
            time.sleep(polling_interval)
        if wait_until_ready and not self.ready():
            raise UnavailableError("Timeout before ready")
        return self

    def stop(self) -> None:
        """Stop the front ends started over this server, unload every model (its worker processes exit and their
        shared memory is released) and stop the core. Stopping a stopped server does nothing."""
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            self._stopped = True
            runtime.stop()

    def _running(self) -> CoreRuntime:
        if self._runtime is None:
            raise InvalidArgumentError("Server not started")
        return self._runtime

    def _ptr(self) -> CoreRuntime:
        """What tritonfrontend attaches to (Triton passes the C server pointer)."""
        return self._running()

    def _call(self, fn: Any) -> Any:
        try:
            return self._running().call(fn)
        except ServiceError as e:
            raise from_service(e) from None

    def _run(self, make_coro: Any) -> Any:
        runtime = self._running()
        try:
            return runtime.run(make_coro(runtime))
        except ServiceError as e:
            raise from_service(e) from None

    # ---- server ------------------------------------------------------------------------------------------
    def metadata(self) -> dict[str, Any]:
        name, version, extensions = self._call(lambda: self._running().engine.server_metadata())
        return {"name": name, "version": version, "extensions": extensions}

    def live(self) -> bool:
        return bool(self._call(lambda: self._running().engine.live))

    def ready(self) -> bool:
        return bool(self._call(lambda: self._running().engine.server_ready()))

    def metrics(self, metric_format: MetricFormat = MetricFormat.PROMETHEUS) -> str:
        """The Prometheus text of the server's metrics."""
        if metric_format != MetricFormat.PROMETHEUS:
            raise UnsupportedError(f"metric format {metric_format!r} is not supported")
        runtime = self._running()
        if not runtime.config.allow_metrics:
            raise UnsupportedError("metrics are disabled (Options.metrics is False)")
        assert runtime.core is not None
        core = runtime.core
        return self._call(lambda: render(core._collectors()).decode())

    # ---- models ------------------------------------------------------------------------------------------
    def model(self, model_name: str, model_version: int = -1) -> Model:
        return Model(self, model_name, model_version)

    def _model_index(self, exclude_not_ready: bool = False) -> list[Model]:
        rows = self._call(lambda: self._running().engine.repository_index(exclude_not_ready))
        return [
            Model(self, r.name, int(r.version) if r.version else -1, r.state or None, r.reason or None) for r in rows
        ]

    def models(self, exclude_not_ready: bool = False) -> ModelDictionary:
        return ModelDictionary(self, self._model_index(exclude_not_ready))

    def load(self, model_name: str, parameters: dict[str, str | int | bool | bytes] | None = None) -> Model:
        """Load (or reload) a model in EXPLICIT mode; `parameters={"config": json}` overrides its config, and
        `"file:<version>/<name>": bytes` parameters send the model's files (with a config), as Triton's."""
        config = ""
        files: dict[str, bytes] = {}
        for key, value in (parameters or {}).items():
            if key.startswith("file:"):
                if not isinstance(value, bytes):
                    raise InvalidArgumentError(f"load parameter '{key}' must be bytes")
                files[key] = value
            elif key == "config":
                config = value.decode() if isinstance(value, bytes) else str(value)
            else:
                raise UnsupportedError(f"load parameter '{key}' is not supported (only 'config' and 'file:')")
        self._run(lambda rt: rt.engine.load_model(model_name, config, files or None))
        return self.model(model_name)

    def unload(
        self,
        model: str | Model,
        unload_dependents: bool = False,
        wait_until_unloaded: bool = False,
        polling_interval: float = 0.1,
        timeout: float | None = None,
    ) -> None:
        """Unload a model in EXPLICIT mode (its in-flight requests finish first)."""
        name = model.name if isinstance(model, Model) else model
        self._run(lambda rt: rt.engine.unload_model(name, unload_dependents))
        start = time.monotonic()
        while wait_until_unloaded and (timeout is None or time.monotonic() - start < timeout):
            if not any(m.name == name and m.state == "READY" for m in self._model_index()):
                break
            time.sleep(polling_interval)

    def poll_model_repository(self) -> None:
        """Rescan the repositories now (POLL mode)."""
        runtime = self._running()
        if runtime.config.model_control_mode != "poll":
            raise UnsupportedError("poll repository is not allowed if polling is not enabled")
        from service.core.repository.poller import RepositoryPoller

        poller = RepositoryPoller(runtime.engine.repository, 0)
        self._run(lambda rt: poller.poll_once())

    def register_model_repository(self, repository_path: str, name_mapping: dict[str, str] | None = None) -> None:
        raise UnsupportedError("registering a model repository on a running server is not supported by Trireme")

    def unregister_model_repository(self, repository_path: str) -> None:
        raise UnsupportedError("unregistering a model repository on a running server is not supported by Trireme")
