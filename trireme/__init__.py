"""Trireme from Python: Triton's in-process API and Python functions served as models.

- `trireme.tritonserver` and `trireme.tritonfrontend`: the names and behaviour of Triton's `tritonserver` and
  `tritonfrontend` modules (`import trireme.tritonserver as tritonserver`, or `trireme.alias_triton_modules()`).
- `trireme.Server`: a `tritonserver.Server` that also serves Python functions (`bind`), starts its front ends
  and works as a context manager, in a notebook's running event loop or outside one.
- `trireme.Tensor`, `trireme.ModelConfig`, `trireme.DynamicBatcher`, `trireme.batch`: PyTriton's declarations.

Names resolve on first use, so that a worker process that imports `trireme.bind.worker` pays for nothing else.
docs/python-api.md.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

# Workers are started with fork+exec while gRPC threads run; gRPC's fork handlers can crash such a child
# between fork and exec (as the command does in service/__main__.py; takes effect if grpc is not imported yet).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

_LAZY = {
    "Server": "trireme.server",
    "Tensor": "trireme.bind.spec",
    "ModelConfig": "trireme.bind.spec",
    "DynamicBatcher": "trireme.bind.spec",
    "TritonConfig": "trireme.bind.spec",
    "batch": "trireme.bind.decorators",
    "tritonserver": "trireme.tritonserver",
    "tritonfrontend": "trireme.tritonfrontend",
}

__all__ = [*_LAZY, "alias_triton_modules"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trireme' has no attribute '{name}'")
    loaded = importlib.import_module(module)
    return loaded if module.endswith(name) else getattr(loaded, name)


def alias_triton_modules() -> None:
    """Make `import tritonserver` and `import tritonfrontend` resolve to Trireme's modules in this process (for
    code written against Triton's in-process API); refuses when NVIDIA's modules are already imported."""
    for name in ("tritonserver", "tritonfrontend"):
        ours = importlib.import_module(f"trireme.{name}")
        present = sys.modules.get(name)
        if present is not None and present is not ours:
            raise RuntimeError(f"module '{name}' is already imported from {getattr(present, '__file__', '?')}")
        sys.modules[name] = ours
