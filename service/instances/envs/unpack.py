"""Packed environments (conda-pack, venv-pack): unpacked once into the cache, keyed by the archive's bytes."""

from __future__ import annotations

import logging
import os
import subprocess
import tarfile

from service.instances.envs.cache import cached_dir, file_digest

log = logging.getLogger("trireme.envs")


class EnvError(Exception):
    """An environment that cannot be used; the message names the model's path."""


def unpacked(archive: str) -> str:
    """The folder of the unpacked archive (unpacked now when the cache does not hold it yet)."""
    try:
        digest = file_digest(archive)
    except OSError as e:
        raise EnvError(f"Failed to read the Python execution environment {archive}: {e.strerror}") from None

    def make(tmp: str) -> None:
        try:
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="tar")  # packed envs hold symlinks (bin/python) to the base install
        except (tarfile.TarError, OSError, EOFError) as e:
            raise EnvError(f"Failed to extract the Python execution environment {archive}: {e}") from None
        fixer = os.path.join(tmp, "bin", "conda-unpack")  # conda-pack: rewrite the prefixes baked into files
        if os.path.exists(fixer):
            python = os.path.join(tmp, "bin", "python")
            done = subprocess.run([python, fixer], capture_output=True, text=True, timeout=600, check=False)
            if done.returncode != 0:
                raise EnvError(f"conda-unpack failed in the environment of {archive}: {done.stderr.strip()[-500:]}")

    folder, made = cached_dir("packed", digest, make)
    if made:
        log.info("unpacked the Python execution environment %s into %s", archive, folder)
    return folder
