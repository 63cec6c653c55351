"""What the embedded example repository lacks on this machine, as one startup line per missing model."""

from __future__ import annotations

import importlib.util
import os

# example models that are generated rather than checked in: name -> (file that must exist, module it needs)
GENERATED_EXAMPLES: dict[str, tuple[str, str]] = {
    "fc_model_pt": (os.path.join("1", "model.pt"), "torch"),
}
TORCH_HINT = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def missing_example_lines(repository: str) -> list[str]:
    """One line per generated example model that will not be served from `repository`, saying why and the fix."""
    lines = []
    for name, (model_file, module) in GENERATED_EXAMPLES.items():
        has_module = importlib.util.find_spec(module) is not None
        generated = os.path.isfile(os.path.join(repository, name, model_file))
        if generated and has_module:
            continue
        if not has_module:
            why = f"it needs {module} ({TORCH_HINT})"
            why += "" if generated else ", then `python tools/make_example_models.py` to generate it"
        else:
            why = "it is generated, not checked in: run `python tools/make_example_models.py` once"
        lines.append(f"example model '{name}' is not served: {why}")
    return lines
