"""SageMaker's multi-model endpoint, as Triton's sagemaker_server.cc answers it.

`POST /models` `{"model_name": HASH, "url": PATH}` loads the model at PATH (`<root>/<hash>/model[/<subdir>]`,
root /opt/ml/models) under the name in the `X-Amzn-SageMaker-Target-Model` header (else HASH): 200, 409 when
HASH or the name is loaded already, 507 when the load ran out of memory, 400 otherwise. A folder with several
models loads the ensemble among them under that name (the others under their own names). `GET /models` lists
`{"models": [{"modelName", "modelUrl"}]}` (ready ones), `GET /models/HASH` one of them (404 when unknown),
`POST /models/HASH/invoke` infers (404 when unknown; any error 400, or 507 out of memory), `DELETE /models/HASH`
unloads (200, 404 when unknown). Other methods are 400.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from service.core.engine import Engine
from service.errors import ErrorCode, ServiceError
from service.frontend.http.message import Request, Response, Stream
from service.frontend.http.routing import Handler
from service.frontend.http.util import error_json, json_response, read_json_object, to_service_error

log = logging.getLogger("trireme.sagemaker")

TARGET_HEADER = "X-Amzn-SageMaker-Target-Model"
_ENSEMBLE = re.compile(r"platform:(\s)*\"ensemble\"")
# Triton's list: a message with one of these is an out-of-memory failure (507)
_OOM = (
    "CUDA out of memory",
    "CUDA_OUT_OF_MEMORY",
    "Out of memory",
    "Out Of Memory",
    "out of memory",
    "MemoryError",
    "OutOfMemory",
    "OOM",
    "Dst tensor is not initialized",
    "Src tensor is not initialized",
    "CNMEM_STATUS_OUT_OF_MEMORY",
    "CUDNN_STATUS_NOT_INITIALIZED",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUBLAS_STATUS_NOT_INITIALIZED",
    "Failed to allocate memory",
    "failed to allocate memory",
    "No space left on device",
)

Invoke = Callable[[Request, str], Awaitable[Response | Stream]]
Guard = Callable[..., Handler]


def out_of_memory(message: str) -> bool:
    """Triton's test: the message names an out-of-memory condition."""
    return any(s in message for s in _OOM)


def _failure(error: Exception) -> Response:
    e = to_service_error(error)
    return error_json(e.message, 507 if out_of_memory(e.message) else 400)


@dataclass(slots=True)
class _Loaded:
    url: str  # what the list shows: <root>/<hash> (config.pbtxt at the url) or the url itself
    target: str  # the model name requests go to
    others: list[str] = field(default_factory=list)  # an ensemble's sibling models, loaded by their own names


class MultiModel:
    """The loaded archives by hash (SageMaker's model name) and the handlers of /models."""

    def __init__(self, engine: Engine, root: str, invoke: Invoke, guard: Guard) -> None:
        self.engine = engine
        self.root = os.path.abspath(root)
        self._invoke = invoke
        self.loaded: dict[str, _Loaded] = {}
        self._path = re.compile(rf"({re.escape(self.root)}/[0-9A-Za-z._]+)/(model)/?([0-9A-Za-z._]+)?")
        self._list = guard("model-repository", GET=self.list_models)
        self._repo = guard("model-repository", GET=self.get_model, POST=self.load, DELETE=self.unload)
        self._inference = guard("inference", POST=self.invoke)
        self._lock = asyncio.Lock()  # loads and unloads one at a time (the list is consistent)

    def handle(self, request: Request, name: str, action: str) -> Awaitable[Response | Stream]:
        request.match_info = {"name": name}
        if request.method == "POST" and action:
            return self._inference(request)
        if request.method == "GET" and not name:
            return self._list(request)
        if request.method in ("GET", "POST", "DELETE"):
            return self._repo(request)
        return _empty(400)

    # ---- list / get ----------------------------------------------------------------------------------------------
    async def list_models(self, request: Request) -> Response:
        models = []
        for name, loaded in self.loaded.items():
            try:
                ready = await self.engine.model_ready(loaded.target)
            except ServiceError:
                ready = False
            if ready:
                models.append({"modelName": name, "modelUrl": loaded.url})
        return json_response({"models": models})

    async def get_model(self, request: Request) -> Response:
        name = request.match_info["name"]
        loaded = self.loaded.get(name)
        if loaded is None:
            return Response(404)
        return json_response({"modelName": name, "modelUrl": loaded.url})

    # ---- invoke --------------------------------------------------------------------------------------------------
    async def invoke(self, request: Request) -> Response | Stream:
        name = request.match_info["name"]
        if name not in self.loaded:
            return Response(404)
        target = request.headers.get(TARGET_HEADER) or name
        log.info("Invoking SageMaker TargetModel: %s", target)
        try:
            return await self._invoke(request, target)
        except Exception as e:
            return _failure(e)

    # ---- load ----------------------------------------------------------------------------------------------------
    async def load(self, request: Request) -> Response:
        try:
            body = await read_json_object(request, 1 << 20)
            name, url = body.get("model_name", ""), body.get("url", "")
            if not isinstance(name, str) or not isinstance(url, str):
                raise ServiceError(ErrorCode.INVALID_ARG, "'model_name' and 'url' must be strings")
        except Exception as e:
            return error_json(to_service_error(e).message, 400)
        path = os.path.abspath(os.path.normpath(url)) if url else os.path.abspath("")
        if path.startswith(("/dev/", "/proc/", "/sys/")):
            log.error('Invalid URL: %s. "url" property value cannot start with /dev/, /proc/, or /sys/.', url)
            return Response(400)
        target = request.headers.get(TARGET_HEADER) or name
        log.info("Loading SageMaker TargetModel: %s", target)
        m = self._path.fullmatch(path)
        if m is None:
            return error_json(
                f"Invalid \"url\" '{url}': expected a path of the form {self.root}/<hash>/model[/<subdir>]", 400
            )
        async with self._lock:
            if name in self.loaded or any(x.target == target for x in self.loaded.values()):
                return error_json(f"failed to register '{path}', there is a conflicting mapping for '{target}'", 409)
            url_shown, model_dir, others = await asyncio.get_running_loop().run_in_executor(
                None, _layout, path, m.group(1)
            )
            try:
                for other in others:
                    await self.engine.load_model_at(other, os.path.join(path, other))
                await self.engine.load_model_at(target, model_dir)
            except ServiceError as e:
                for other in others:
                    await self.engine.forget_model(other)
                if e.code == ErrorCode.ALREADY_EXISTS:
                    return error_json(e.message, 409)
                return _failure(e)
            self.loaded[name] = _Loaded(url_shown, target, others)
        return Response(200)

    # ---- unload --------------------------------------------------------------------------------------------------
    async def unload(self, request: Request) -> Response:
        name = request.match_info["name"]
        async with self._lock:
            loaded = self.loaded.get(name)
            if loaded is None:
                return Response(404)
            target = request.headers.get(TARGET_HEADER) or loaded.target
            log.info("Unloading SageMaker TargetModel: %s", target)
            try:
                await self.engine.forget_model(loaded.target)
                for other in loaded.others:
                    await self.engine.forget_model(other)
            except ServiceError as e:
                return error_json(e.message, 400)
            finally:
                del self.loaded[name]
        return Response(200)


def _layout(path: str, parent: str) -> tuple[str, str, list[str]]:
    """(url to list, folder of the model to load, sibling models to load first) for an archive at `path`.

    config.pbtxt at `path`: the model is `path` itself and the list shows `<root>/<hash>`. Otherwise `path` is a
    repository: its one model, or the ensemble among several (then the others load under their own names)."""
    if os.path.isfile(os.path.join(path, "config.pbtxt")):
        return parent, path, []
    subdirs = sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d))) if os.path.isdir(path) else []
    chosen = subdirs[-1] if subdirs else ""
    for d in subdirs:
        try:
            with open(os.path.join(path, d, "config.pbtxt"), encoding="utf-8") as f:
                if _ENSEMBLE.search(f.read()):
                    chosen = d
                    log.info("SageMaker front-end detected an Ensemble config at path: %s/%s/config.pbtxt", path, d)
        except OSError:
            continue
    others = [d for d in subdirs if d != chosen and os.path.isfile(os.path.join(path, d, "config.pbtxt"))]
    return path, os.path.join(path, chosen), others


async def _empty(status: int) -> Response:
    return Response(status)
