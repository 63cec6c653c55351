"""Generate the example models that are binaries (TorchScript) instead of checking them in.

    python tools/make_example_models.py                      # into service/example_models/
    python tools/make_example_models.py --repository DIR     # into another model repository

fc_model_pt is the seed tutorial's TorchScript model: an Embedding(100, 8), a Linear(8, 4) and four
Linear(8, 8) layers, traced to model.pt and served with platform "pytorch_libtorch". The script writes the
model's config.pbtxt together with model.pt, so a repository never holds a config whose model file is
missing (the server exits on such a load error by default). Needs torch; without it nothing is written and
the exit status is 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_REPOSITORY = ROOT / "service" / "example_models"

FC_MODEL_CONFIG = """\
name: "fc_model_pt"
platform: "pytorch_libtorch"
max_batch_size: 64
input [
  { name: "input__0" data_type: TYPE_INT64 dims: [ -1 ] }
]
output [
  { name: "output__0" data_type: TYPE_FP32 dims: [ -1, -1, 4 ] },
  { name: "output__1" data_type: TYPE_FP32 dims: [ -1, -1, 8 ] }
]
"""


def fc_model(seed: int = 0) -> Any:
    """The seed tutorial's module (deterministic weights); forward(x: int64[B, T]) -> ([B, T, 4], [B, T, 8])."""
    import torch

    class FCModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = torch.nn.Embedding(100, 8)
            self.fc = torch.nn.Linear(8, 4)
            self.fcs = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(4)])

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            embedded = self.embedding(x)
            hidden = embedded
            for layer in self.fcs:
                hidden = torch.relu(layer(hidden))
            return self.fc(embedded), hidden

    torch.manual_seed(seed)
    return FCModel().eval()


def write_fc_model_pt(repository: Path) -> Path:
    """Trace fc_model to <repository>/fc_model_pt/1/model.pt and write its config.pbtxt; returns the model dir."""
    import torch

    model_dir = repository / "fc_model_pt"
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    example = torch.randint(0, 100, (2, 3), dtype=torch.int64)
    with torch.no_grad():
        traced = torch.jit.trace(fc_model(), example)
    traced.save(str(model_dir / "1" / "model.pt"))
    (model_dir / "config.pbtxt").write_text(FC_MODEL_CONFIG)
    return model_dir


def main(argv: list[str] | None = None) -> int:
    """Write every generated example model into the repository."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, default=EXAMPLE_REPOSITORY)
    args = parser.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.stderr.write("torch is not installed: no TorchScript example model written\n")
        return 2
    path = write_fc_model_pt(args.repository)
    sys.stdout.write(f"wrote {path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
