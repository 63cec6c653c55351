"""Trireme against the Python serving frameworks a user would pick instead (see run.py and docs/benchmarks.md)."""
