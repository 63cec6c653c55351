"""The engine under the Python API: its event-loop thread and the running core (no public names here)."""
