"""Measuring: model data and payloads, load schedules, measurement windows, worker processes, one session."""
