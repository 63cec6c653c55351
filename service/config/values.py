"""Flag value parsers shared by the flag modules."""

from __future__ import annotations

import argparse

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_bool(text: str) -> bool:
    """Triton-style boolean flag value."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got '{text}'")
