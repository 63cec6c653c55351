"""Compile Trireme's hot path with mypyc, in place: a `.so` beside each module of service/compiled.py's list.

    python tools/build_compiled.py            # compile (about N s on 2 cores; the C compile runs in parallel)
    python tools/build_compiled.py --clean    # remove the compiled modules: back to the pure-Python build
    python tools/build_compiled.py --list     # print the module list

mypyc comes with mypy (the dev extra). The same `.py` files stay the source of truth: rebuild after editing one
of the listed modules (a stale `.so` would run the old code), or --clean. `TRIREME_PURE_PYTHON=1` runs the pure
build without removing anything. setup.py uses `extensions()` for wheels (TRIREME_COMPILE).
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MYPYC_REQUIREMENT = "mypy>=1.10"  # mypyc ships in the mypy package
COMPILE_ENV = "TRIREME_COMPILE"
GROUP = "trireme"  # the shared library: trireme__mypyc.<abi>.so at the top level, beside the `service` package
BUILD_DIR = "build/mypyc"


def _modules() -> tuple[str, ...]:
    sys.path.insert(0, str(ROOT))
    from service.compiled import COMPILED_MODULES

    return COMPILED_MODULES


def extensions() -> list[Any]:
    """setuptools Extension objects for the listed modules (runs mypy and writes the C sources; cwd = ROOT)."""
    from mypyc.build import mypycify

    return mypycify(list(_modules()), opt_level="3", debug_level="0", multi_file=True, group_name=GROUP,
                    target_dir=BUILD_DIR)  # fmt: skip


def compile_setting() -> str:
    """TRIREME_COMPILE: "1" (compile, or fail), "0" (never), "" (unset: wheels compile when they can)."""
    value = os.environ.get(COMPILE_ENV, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return "1"
    return "0" if value in ("0", "false", "no", "off") else ""


def wheel_extensions(argv: list[str]) -> list[Any]:
    """setup.py's ext_modules: what TRIREME_COMPILE asks for (see setup.py)."""
    setting = compile_setting()
    building = any(c in ("bdist_wheel", "editable_wheel", "build_ext", "build") for c in argv)
    if not building or setting == "0" or (setting == "" and "bdist_wheel" not in argv):
        return []  # metadata steps, editable installs and TRIREME_COMPILE=0 build nothing
    if setting == "" and not _can_compile():
        print("[trireme] no mypyc or no C compiler here: building the pure-Python wheel", file=sys.stderr)
        return []
    return extensions()


def _can_compile() -> bool:
    """mypyc importable and the C compiler setuptools would use present."""
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        return False
    import sysconfig

    cc = (sysconfig.get_config_var("CC") or "cc").split()
    return bool(cc) and shutil.which(os.environ.get("CC", cc[0]).split()[0]) is not None


def build(jobs: int) -> None:
    from setuptools import Distribution

    os.chdir(ROOT)
    dist = Distribution({"name": "trireme-compiled", "ext_modules": extensions()})
    cmd: Any = dist.get_command_obj("build_ext")
    cmd.inplace = True
    cmd.parallel = jobs
    cmd.build_temp = f"{BUILD_DIR}/temp"
    dist.run_command("build_ext")


def built_files() -> list[Path]:
    """Compiled artefacts in the source tree: the listed modules' extensions and the group's shared library."""
    found = [Path(p) for p in glob.glob(str(ROOT / f"{GROUP}__mypyc.*.so"))]
    for root in ("service", "shm"):
        found += sorted((ROOT / root).rglob("*.so"))
    return found


def clean() -> None:
    for path in built_files():
        path.unlink()
        print(f"removed {path.relative_to(ROOT)}")
    shutil.rmtree(ROOT / BUILD_DIR, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clean", action="store_true", help="remove compiled modules (the pure-Python build)")
    ap.add_argument("--list", action="store_true", help="print the compiled module list and exit")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel C compiles (all cores)")
    args = ap.parse_args()
    if args.list:
        print("\n".join(_modules()))
        return
    if args.clean:
        clean()
        return
    start = time.monotonic()
    clean()
    build(args.jobs)
    print(f"[build_compiled] {len(_modules())} modules compiled with mypyc in {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
