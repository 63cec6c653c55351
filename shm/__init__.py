"""Shared-memory regions and tensor codecs, usable by clients and the server alike (no import of service/)."""
