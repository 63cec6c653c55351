"""trireme-perf: a perf_analyzer-style load generator and benchmark harness (see docs/load.md)."""
