"""Which build of Trireme runs: modules compiled with mypyc, or pure Python (and how to force pure Python).

The hot path can be compiled from its own typed sources with mypyc (`tools/build_compiled.py`, or a wheel/image
build): each module below then has a `.so` beside its `.py`, and Python's import system prefers the `.so`.
`TRIREME_PURE_PYTHON=1` forces the `.py` files even where `.so` files are present: `service/__init__.py` puts a
finder first on `sys.meta_path` that finds Trireme's modules from their sources only. Worker and front-end
processes inherit the environment, so every process of a server runs the same build.

COMPILED_MODULES is the one list of compiled modules: the build reads it, `trireme --version` reports it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

PURE_ENV = "TRIREME_PURE_PYTHON"

# Source paths relative to the repository root, chosen by measurement (docs/performance.md, "Compiled build").
# A module is left out where compiling would change what it does (tests or users patch its functions, set
# attributes on its objects, or subclass its classes) or where it cannot be compiled: service/worker/main.py runs
# as `python -m service.worker.main` (runpy cannot run an extension module), service/ipc/frames.py declares
# msgspec Structs (mypyc drops their class keywords: tag, array_like), service/worker/backends/python.py's class
# is subclassed at run time (load_backend_class), service/instances/transfer.py's ArenaTransfer is a second base of
# WorkerProcess beside FrameDispatch (two compiled bases conflict; a non-native class rejects subclasses);
# service/frontend/grpc/handlers.py: mypyc 2.4 emits C that does not compile (two closures' environments of the
# same name); service/worker/pb_utils/requests.py: the worker builds each InferenceRequest without its public
# constructor (`__new__`: that constructor checks its arguments as Triton's does), which a compiled class does not
# allow (its `__new__` runs `__init__`).
# In service/frontend/grpc/h2/ the per-request modules are compiled; headers.py (its HPACK work is in the pure-Python
# hpack package), server.py, roles.py (Protocols) and peer.py are not; its CallGone (a ConnectionResetError) is a
# non-native class, and a streaming call's request iterator is a class (mypyc compiles no async generator).
# service/core/observability/stats.py is compiled although its ModelStats crosses the front-end link pickled (the
# statistics call): mypyc's compiled dataclasses pickle and unpickle as interpreted ones do.
COMPILED_MODULES: tuple[str, ...] = (
    "service/frontend/grpc/codec.py",
    "service/frontend/grpc/wire.py",
    "service/frontend/grpc/varints.py",
    "service/frontend/http/codec.py",
    "service/frontend/http/json_tensors.py",
    "service/frontend/http/h1.py",
    "service/frontend/http/server.py",
    "service/frontend/http/routing.py",
    "service/frontend/http/heads.py",
    "service/core/engine.py",
    "service/core/pipeline/validation.py",
    "service/core/pipeline/callbacks.py",
    "service/core/pipeline/shm_holds.py",
    "service/core/observability/stats.py",
    "service/core/scheduling/scheduler.py",
    "service/core/scheduling/direct.py",
    "service/core/scheduling/dynamic_batcher.py",
    "service/instances/dispatch.py",
    "service/ipc/framing.py",
    "service/worker/channel.py",
    "service/remote/host.py",
    "service/remote/wire.py",
    "service/remote/tensors.py",
    "service/frontend/grpc/h2/connection.py",
    "service/frontend/grpc/h2/reader.py",
    "service/frontend/grpc/h2/outbound.py",
    "service/frontend/grpc/h2/stream.py",
    "service/frontend/grpc/h2/messages.py",
    "service/frontend/grpc/h2/context.py",
    "service/frontend/grpc/h2/runner.py",
    "service/frontend/grpc/h2/frames.py",
    "service/frontend/grpc/h2/keepalive.py",
)

_ROOTS = ("service", "shm")


def module_name(path: str) -> str:
    """'service/ipc/frames.py' -> 'service.ipc.frames'."""
    return path.removesuffix(".py").replace("/", ".")


def pure_forced() -> bool:
    """True when TRIREME_PURE_PYTHON asks for the pure-Python build."""
    return os.environ.get(PURE_ENV, "").strip().lower() not in ("", "0", "false", "no")


class SourceOnlyFinder:
    """A meta-path finder for Trireme's own modules that sees only `.py` (and `.pyc`) files, never extension
    modules: with it first on sys.meta_path the pure-Python build runs although compiled `.so` files sit beside
    the sources."""

    _loaders = (
        (importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES),
        (importlib.machinery.SourcelessFileLoader, importlib.machinery.BYTECODE_SUFFIXES),
    )

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] not in _ROOTS or path is None:
            return None
        for entry in path:
            spec = importlib.machinery.FileFinder(entry, *self._loaders).find_spec(fullname)
            if spec is not None and spec.loader is not None:
                return spec
        return None

    def invalidate_caches(self) -> None:
        return None


def force_pure_python() -> None:
    """Install the source-only finder (idempotent)."""
    if not any(isinstance(f, SourceOnlyFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, SourceOnlyFinder())


def compiled_in_use() -> list[str]:
    """The listed modules that this process imports from a compiled extension (by their import spec; a module
    already imported is judged by its __file__)."""
    found = []
    for path in COMPILED_MODULES:
        name = module_name(path)
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None) if module is not None else _origin(name)
        if origin and origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
            found.append(name)
    return found


def _origin(name: str) -> str | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None else None


def build_text() -> str:
    """What `trireme --version` says about the build."""
    compiled = compiled_in_use()
    if compiled:
        return f"compiled with mypyc ({len(compiled)} of {len(COMPILED_MODULES)} hot-path modules)"
    if pure_forced():
        return f"pure Python (forced by {PURE_ENV})"
    return "pure Python"
