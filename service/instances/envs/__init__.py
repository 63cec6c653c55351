"""Per-model Python environments: EXECUTION_ENV_PATH (a conda-pack / venv-pack archive or an unpacked
environment) and Trireme's requirements.txt environments built with uv; the worker runs in them.

request.py (what a model's config asks for), cache.py (the content-keyed cache), unpack.py (archives),
uvbuild.py (requirements), probe.py (the interpreter and its compatibility with the worker), prepare.py (glue).
"""
