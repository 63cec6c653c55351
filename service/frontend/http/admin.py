"""HTTP/REST admin endpoints: repository index/load/unload, system and CUDA shared memory, logging, trace setting.

Each answers what the gRPC service answers for the same call, in Triton's JSON shapes; successful POSTs
without a result (register, unregister, load, unload) are 200 with an empty body.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

from service.core.facade import Facade
from service.core.observability.stats import DURATION_FIELDS, Duration, ModelStats
from service.errors import ErrorCode, ServiceError, invalid_arg
from service.frontend.http.message import Request, Response
from service.frontend.http.util import json_response, read_json_object
from shm.errors import ShmError

Route = Callable[..., None]
CUDA_IPC_HANDLE_SIZE = 64


def _duration(d: Duration) -> dict[str, int]:
    return {"count": d.count, "ns": d.ns}


def stats_json(name: str, version: str, s: ModelStats) -> dict[str, Any]:
    """One model_stats entry with every key perf_analyzer reads."""
    return {
        "name": name,
        "version": version,
        "last_inference": s.last_inference_ms,
        "inference_count": s.inference_count,
        "execution_count": s.execution_count,
        "inference_stats": {f: _duration(getattr(s, f)) for f in DURATION_FIELDS},
        "response_stats": {},
        "batch_stats": [
            {
                "batch_size": size,
                "compute_input": _duration(b.compute_input),
                "compute_infer": _duration(b.compute_infer),
                "compute_output": _duration(b.compute_output),
            }
            for size, b in sorted(s.batch_stats.items())
        ],
        "memory_usage": [],
    }


def _json(value: object) -> Response:
    return json_response(value)


_OK = Response  # an empty 200


class AdminRoutes:
    """Handlers for the non-inference POST/GET endpoints."""

    def __init__(self, engine: Facade, max_input_size: int) -> None:
        self.engine = engine
        self.max_input_size = max_input_size

    def add_routes(self, route: Route) -> None:
        """Register every admin path with `route(path, api_group, METHOD=handler, ...)`."""
        repo, shm = "model-repository", "shared-memory"
        route("/v2/repository/index", repo, POST=self.index)
        route("/v2/repository/models/{model}/load", repo, POST=self.load)
        route("/v2/repository/models/{model}/unload", repo, POST=self.unload)
        route("/v2/repository/{repo}/index", repo, POST=self.named_repository)
        route("/v2/repository/{repo}/models/{model}/{action:load|unload}", repo, POST=self.named_repository)
        for kind in ("system", "cuda"):
            base = f"/v2/{kind}sharedmemory"
            route(base + "/status", shm, GET=self.shm_status)
            route(base + "/region/{region}/status", shm, GET=self.shm_status)
            route(base + "/region/{region}/register", shm, POST=self.shm_register)
            route(base + "/unregister", shm, POST=self.shm_unregister)
            route(base + "/region/{region}/unregister", shm, POST=self.shm_unregister)
        route("/v2/logging", "logging", GET=self.logging, POST=self.logging)
        route("/v2/trace/setting", "trace", GET=self.trace, POST=self.trace)
        route("/v2/models/{model}/trace/setting", "trace", GET=self.trace, POST=self.trace)

    async def _body(self, request: Request) -> dict[str, Any]:
        return await read_json_object(request, self.max_input_size)

    # ---- repository -------------------------------------------------------------------------------------
    async def index(self, request: Request) -> Response:
        """[{"name", "version"?, "state"?, "reason"?}] for every (model, version) known; {"ready": true} filters."""
        ready = (await read_json_object(request, self.max_input_size, depth_last=True)).get("ready", False)
        if not isinstance(ready, bool):
            raise invalid_arg("Invalid value for 'ready': expected a boolean")
        rows = []
        for r in self.engine.repository_index(ready):
            row = {"name": r.name}
            for key in ("version", "state", "reason"):
                if getattr(r, key):
                    row[key] = getattr(r, key)
            rows.append(row)
        return _json(rows)

    async def load(self, request: Request) -> Response:
        """Load or reload a model (explicit mode); parameters.config overrides its config.pbtxt."""
        params = (await self._body(request)).get("parameters") or {}
        if not isinstance(params, dict):
            raise invalid_arg("Unable to parse 'parameters': expected an object")
        config_json = ""
        files: dict[str, bytes] = {}
        for key, value in params.items():
            if key == "config":
                if not isinstance(value, str):
                    raise invalid_arg("'config' parameter is expected to be a string")
                config_json = value
            elif key.startswith("file:"):
                if not isinstance(value, str):
                    raise invalid_arg(f"Unable to parse '{key}': expected a base64-encoded string")
                try:
                    files[key] = base64.b64decode(value, validate=True)
                except binascii.Error:
                    raise invalid_arg(f"Unable to parse '{key}': invalid base64 content") from None
            else:
                raise invalid_arg(f"unrecognized load parameter '{key}'.")
        await self.engine.load_model(request.match_info["model"], config_json, files)
        return _OK()

    async def unload(self, request: Request) -> Response:
        """Unload every version of a model (explicit mode)."""
        params = (await self._body(request)).get("parameters") or {}
        dependents = params.get("unload_dependents", False) if isinstance(params, dict) else None
        if not isinstance(dependents, bool):
            raise invalid_arg("Unable to parse 'unload_dependents': expected a boolean")
        await self.engine.unload_model(request.match_info["model"], dependents)
        return _OK()

    async def named_repository(self, request: Request) -> Response:
        """A repository name in the path is not supported (as Triton)."""
        raise ServiceError(ErrorCode.UNSUPPORTED, "'repository_name' specification is not supported")

    # ---- shared memory ------------------------------------------------------------------------------------
    @staticmethod
    def _kind(request: Request) -> str:
        return "cuda" if request.path.startswith("/v2/cuda") else "system"

    def _registry(self) -> Any:
        return self.engine.client_shm()

    async def shm_status(self, request: Request) -> Response:
        """[{"name", "key", "offset", "byte_size"}] (system) or [{"name", "device_id", "byte_size"}] (CUDA)."""
        kind, name = self._kind(request), request.match_info.get("region", "")
        registry = self.engine.shm_registry
        if registry is None:
            if name:
                raise ShmError("NOT_FOUND", f"Unable to find {kind} shared memory region: '{name}'")
            return _json([])
        if kind == "system":
            return _json(
                [
                    {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
                    for r in registry.system_status(name)
                ]
            )
        return _json(
            [{"name": r.name, "device_id": r.device_id, "byte_size": r.byte_size} for r in registry.cuda_status(name)]
        )

    async def shm_register(self, request: Request) -> Response:
        """Register a region: {"key", "offset"?, "byte_size"} or {"raw_handle": {"b64"}, "device_id", "byte_size"}."""
        kind, name = self._kind(request), request.match_info["region"]
        body = await self._body(request)
        registry = self._registry()
        size = _required_uint(body, "byte_size")
        if kind == "system":
            key = body.get("key")
            if not isinstance(key, str):
                raise invalid_arg("Shared memory register request has no 'key' field")
            offset = _uint_field(body, "offset", 0)
            registry.register_system(name, key, offset, size)
        else:
            handle = body.get("raw_handle")
            b64 = handle.get("b64") if isinstance(handle, dict) else None
            if not isinstance(b64, str):
                raise invalid_arg("Shared memory register request has no 'raw_handle' field")
            try:
                raw = base64.b64decode(b64, validate=True)
            except (binascii.Error, ValueError):
                raw = b""
            if len(raw) != CUDA_IPC_HANDLE_SIZE:
                raise invalid_arg("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
            registry.register_cuda(name, raw, _uint_field(body, "device_id", 0), size)
        return _OK()

    async def shm_unregister(self, request: Request) -> Response:
        """Unregister one region, or every region of that kind; an unknown name is a no-op."""
        kind, name = self._kind(request), request.match_info.get("region", "")
        registry = self._registry()
        if kind == "system":
            registry.unregister_system(name)
        else:
            registry.unregister_cuda(name)
        return _OK()

    # ---- settings -----------------------------------------------------------------------------------------
    async def logging(self, request: Request) -> Response:
        """GET: the six log settings; POST: change some, then answer all six."""
        if request.method == "POST":
            changes = await self._body(request)
            if changes:
                self.engine.log_settings.update(changes)
        return _json(self.engine.log_settings.as_dict())

    async def trace(self, request: Request) -> Response:
        """GET: the global or a model's trace settings; POST: change some (null clears a model's key) first."""
        updates: dict[str, list[str] | None] = {}
        if request.method == "POST":
            for key, value in (await self._body(request)).items():
                if value is None:
                    updates[key] = None
                elif isinstance(value, str):
                    updates[key] = [value]
                elif isinstance(value, list) and all(isinstance(v, str) for v in value):
                    updates[key] = value
                else:
                    raise invalid_arg(f"Unable to parse '{key}': expected a string or a list of strings")
        current = self.engine.trace_setting(request.match_info.get("model", ""), updates)
        # HTTP shape: trace_level is a list, every other setting a plain string
        return _json({key: values if key == "trace_level" else values[0] for key, values in current.items()})


def _uint_field(body: dict[str, Any], key: str, default: int) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid_arg(f"Unable to parse '{key}': expected an unsigned integer")
    return value


def _required_uint(body: dict[str, Any], key: str) -> int:
    if key not in body:
        raise invalid_arg(f"Shared memory register request has no '{key}' field")
    return _uint_field(body, key, 0)
