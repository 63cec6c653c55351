"""Trireme: a Triton-compatible inference server in Python."""

__version__ = "2.73.0-trireme.0.1"
