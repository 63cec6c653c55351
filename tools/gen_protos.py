"""Regenerate the Python protobuf / gRPC code for ``protos/*.proto``.

Runs ``grpc_tools.protoc`` from the repository root with ``-I .`` so generated
modules import each other as ``from protos import model_config_pb2``. Writes
``protos/*_pb2.py``, ``protos/*_pb2_grpc.py`` and ``protos/*_pb2.pyi``.

Usage::

    python tools/gen_protos.py           # regenerate in place
    python tools/gen_protos.py --check   # exit 1 if committed files are stale
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"
GENERATED_GLOBS = ("*_pb2.py", "*_pb2_grpc.py", "*_pb2.pyi")


def generate(out_dir: Path) -> None:
    """Compile every ``protos/*.proto`` into ``out_dir`` (absolute; receives a ``protos/`` subtree)."""
    protos = sorted(p.relative_to(ROOT).as_posix() for p in PROTO_DIR.glob("*.proto"))
    args = [
        "grpc_tools.protoc",
        "-I.",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    with contextlib.chdir(ROOT):
        rc = protoc.main(args)
    if rc != 0:
        raise SystemExit(f"protoc failed for {protos}")
    use_private_pool(out_dir)


POOL_LINE = "_descriptor_pool.Default().AddSerializedFile("
PRIVATE_POOL_LINE = "PROTOS_POOL.AddSerializedFile("
POOL_IMPORT = "from protos._pool import PROTOS_POOL\n"


def use_private_pool(out_dir: Path) -> None:
    """Point the generated *_pb2.py files at our own descriptor pool (protos/_pool.py).

    tritonclient's generated code registers the same `inference.*` names in protobuf's default pool; with a
    private pool both can live in one process (tests, and user code that imports both).
    """
    for path in (out_dir / "protos").glob("*_pb2.py"):
        text = path.read_text()
        if POOL_LINE in text:
            text = text.replace(POOL_LINE, PRIVATE_POOL_LINE)
            text = text.replace(
                "# @@protoc_insertion_point(imports)\n", POOL_IMPORT + "# @@protoc_insertion_point(imports)\n", 1
            )
            path.write_text(text)


def generated_files(base: Path) -> dict[str, bytes]:
    """Map file name -> contents of the generated files under ``base/protos``."""
    return {p.name: p.read_bytes() for g in GENERATED_GLOBS for p in (base / "protos").glob(g)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only verify the committed files are fresh")
    opts = parser.parse_args(argv)

    if not opts.check:
        generate(ROOT)
        print(f"generated {len(generated_files(ROOT))} files in {PROTO_DIR}")
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp).resolve())
        fresh = generated_files(Path(tmp))
    current = generated_files(ROOT)
    stale = sorted(n for n in fresh.keys() | current.keys() if fresh.get(n) != current.get(n))
    for name in stale:
        print(f"stale: protos/{name} (run tools/gen_protos.py)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
