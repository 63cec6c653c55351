"""setuptools hook for the compiled build (mypyc; service/compiled.py lists the modules, tools/build_compiled.py
builds them). TRIREME_COMPILE=1: compile (a failure fails the build); 0: never; unset: compile for a wheel (`pip
install .`, `pip wheel .`, `python -m build`) when mypyc and a C compiler are there, else a pure-Python wheel.
An editable install (`pip install -e .`) compiles only with TRIREME_COMPILE=1: for development in place, run
`python tools/build_compiled.py` instead."""

from __future__ import annotations

import os
import sys

from setuptools import setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tools.build_compiled import wheel_extensions

setup(ext_modules=wheel_extensions(sys.argv))
