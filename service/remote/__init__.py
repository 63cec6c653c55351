"""Several front-end processes over one core process (`--frontend-processes N`, docs/architecture.md)."""
