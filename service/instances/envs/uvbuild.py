"""requirements.txt environments (Trireme's own, Triton has none): built with uv from the package registry the
machine is configured for, cached by the file's content (and the server's Python and numpy), reused while the
file is unchanged."""

from __future__ import annotations

import configparser
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys

import numpy

from service.instances.envs.cache import cached_dir
from service.instances.envs.unpack import EnvError

log = logging.getLogger("trireme.envs")

UV_ENV = "TRIREME_UV"  # the uv executable (default: the one beside the server's Python, else on PATH)
BUILD_TIMEOUT_ENV = "TRIREME_UV_TIMEOUT_S"  # a build that takes longer fails the load (default 900 s)
_UV_INDEX_VARS = ("UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS")


def uv_executable() -> str:
    found = os.environ.get(UV_ENV) or os.path.join(os.path.dirname(sys.executable), "uv")
    if os.path.exists(found):
        return found
    on_path = shutil.which("uv")
    if on_path is None:
        raise EnvError("building a Python environment from requirements needs uv: pip install 'trireme[envs]'")
    return on_path


def pip_registry_args() -> list[str]:
    """uv arguments for pip's configured registry (PIP_* variables, then pip.conf files), unless uv has its own
    (UV_INDEX_URL and friends, which uv reads itself)."""
    if any(os.environ.get(v) for v in _UV_INDEX_VARS):
        return []
    values: dict[str, str] = {}
    files = ["/etc/pip.conf", "/etc/xdg/pip/pip.conf", os.path.expanduser("~/.pip/pip.conf")]
    files.append(os.path.join(os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"), "pip", "pip.conf"))
    if os.environ.get("PIP_CONFIG_FILE"):
        files.append(os.environ["PIP_CONFIG_FILE"])
    for path in files:
        parser = configparser.ConfigParser()
        try:
            parser.read(path)
        except configparser.Error:
            continue
        for section in ("global", "install"):
            if parser.has_section(section):
                values.update(
                    {k: v for k, v in parser.items(section) if k in ("index-url", "extra-index-url", "find-links")}
                )
    for key in ("index-url", "extra-index-url", "find-links"):
        env = os.environ.get("PIP_" + key.upper().replace("-", "_"))
        if env:
            values[key] = env
    args: list[str] = []
    if values.get("index-url"):
        args += ["--index-url", values["index-url"].split()[0]]
    for url in values.get("extra-index-url", "").split():
        args += ["--extra-index-url", url]
    for link in values.get("find-links", "").split():
        args += ["--find-links", link]
    return args


def _mentions_numpy(text: str) -> bool:
    return any(re.match(r"\s*numpy\b", line, re.IGNORECASE) for line in text.splitlines())


def built(requirements: str) -> str:
    """The folder of the environment the requirements file describes (built now when not cached)."""
    try:
        with open(requirements, "rb") as f:
            content = f.read()
    except OSError as e:
        raise EnvError(f"Failed to read the requirements file {requirements}: {e.strerror}") from None
    # the worker needs numpy: the server's version unless the file pins its own
    pins = [] if _mentions_numpy(content.decode(errors="replace")) else [f"numpy=={numpy.__version__}"]
    registry = pip_registry_args()
    key = "\n".join([sys.version, *pins, *registry]).encode() + b"\n" + content
    digest = hashlib.sha256(key).hexdigest()

    def make(tmp: str) -> None:
        uv = uv_executable()
        timeout = float(os.environ.get(BUILD_TIMEOUT_ENV, "900"))
        steps = [
            [uv, "venv", "--quiet", "--relocatable", "--python", sys.executable, tmp],
            [
                uv,
                "pip",
                "install",
                "--quiet",
                "--python",
                os.path.join(tmp, "bin", "python"),
                *registry,
                "-r",
                requirements,
                *pins,
            ],
        ]
        for step in steps:
            try:
                done = subprocess.run(step, capture_output=True, text=True, timeout=timeout, check=False)
            except subprocess.TimeoutExpired:
                raise EnvError(f"building the Python environment of {requirements} took over {timeout:g} s") from None
            if done.returncode != 0:
                detail = " ".join(done.stderr.split())[-800:]
                raise EnvError(f"failed to build the Python environment of {requirements} with uv: {detail}")

    folder, made = cached_dir("requirements", digest, make)
    if made:
        log.info("built the Python environment of %s into %s", requirements, folder)
    return folder
