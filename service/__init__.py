"""Trireme: a Triton-compatible inference server in Python."""

TRIREME_VERSION = "0.1.0"  # the package version (pyproject.toml)
TRITON_VERSION = "2.73.0"  # the Triton release whose behaviour Trireme follows and reports
# what ServerMetadata reports: Triton's version, so clients that check it see 2.73, tagged with Trireme's
__version__ = f"{TRITON_VERSION}-trireme.{TRIREME_VERSION.rsplit('.', 1)[0]}"


def version_text() -> str:
    """The `trireme --version` line."""
    return f"trireme {TRIREME_VERSION} (Triton Inference Server {TRITON_VERSION} compatible; reports {__version__})"
