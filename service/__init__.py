"""Trireme: a Triton-compatible inference server in Python."""

from service.compiled import force_pure_python, pure_forced

# TRIREME_PURE_PYTHON=1: run the pure-Python build even where compiled modules are present (service/compiled.py)
if pure_forced():
    force_pure_python()

TRIREME_VERSION = "0.1.0"  # the package version (pyproject.toml)
TRITON_VERSION = "2.73.0"  # the Triton release whose behaviour Trireme follows and reports
# what ServerMetadata reports: Triton's version, so clients that check it see 2.73, tagged with Trireme's
__version__ = f"{TRITON_VERSION}-trireme.{TRIREME_VERSION.rsplit('.', 1)[0]}"


def version_text() -> str:
    """What `trireme --version` prints: the version line, then which build runs (mypyc-compiled or pure Python)."""
    from service.compiled import build_text

    return (
        f"trireme {TRIREME_VERSION} (Triton Inference Server {TRITON_VERSION} compatible; reports {__version__})\n"
        f"build: {build_text()}"
    )
