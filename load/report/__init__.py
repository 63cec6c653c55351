"""Reporting: perf_analyzer-style console blocks, the table, CSV and JSON summaries, and latency plots."""
