"""Model repositories the hot-path benchmarks share: the unbatched FP32 identity model, in each instance mode."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IDENTITY_SRC = ROOT / "service" / "example_models" / "identity_fp32_any" / "1" / "model.py"

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{extra}"""

MODE = 'parameters {{ key: "TRIREME_INSTANCE_MODE" value: {{ string_value: "{mode}" }} }}\n'

MODEL = "identity"  # unbatched FP32 [-1] identity, one worker-process instance (the default)
MODEL_IN_PROCESS = "identity_inproc"  # the same model with an in-process instance (Trireme only)
MODEL_INLINE = "identity_inline"  # ... with an in-process instance that executes on the event loop


def write_identity(repo: Path, name: str = MODEL, in_process: bool | str = False) -> None:
    """Add the unbatched identity model `name` to repo (in-process instance when asked; a string picks the
    TRIREME_INSTANCE_MODE value)."""
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy(IDENTITY_SRC, repo / name / "1" / "model.py")
    mode = in_process if isinstance(in_process, str) else "in_process"
    extra = MODE.format(mode=mode) if in_process else ""
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, extra=extra))


def identity_repos(work: Path) -> tuple[Path, Path]:
    """(repo with both Trireme models, repo with only the worker-process model for Triton)."""
    trireme, triton = work / "repo_trireme", work / "repo_triton"
    write_identity(trireme)
    write_identity(trireme, MODEL_IN_PROCESS, in_process=True)
    write_identity(triton)
    return trireme, triton
