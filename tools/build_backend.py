"""The PEP 517 build backend: setuptools', plus mypy (mypyc) among the build requirements when a wheel is compiled
(TRIREME_COMPILE, setup.py). An editable install needs nothing more than setuptools."""

from __future__ import annotations

from typing import Any

from build_compiled import MYPYC_REQUIREMENT, compile_setting
from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    requires = list(_setuptools.get_requires_for_build_wheel(config_settings))
    return requires + ([MYPYC_REQUIREMENT] if compile_setting() != "0" else [])


def get_requires_for_build_editable(config_settings: dict[str, Any] | None = None) -> list[str]:
    requires = list(_setuptools.get_requires_for_build_editable(config_settings))
    return requires + ([MYPYC_REQUIREMENT] if compile_setting() == "1" else [])
