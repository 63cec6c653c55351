#!/usr/bin/env bash
# Installs the reference tools Trireme is compared against, all from public packages, into $TRIREME_TOOLS
# (default ${XDG_CACHE_HOME:-~/.cache}/trireme/tools, a per-user cache; the tests and benchmarks look where
# TRIREME_TOOLS points too, see load/tools.py):
#   bin/perf_analyzer    Triton's perf_analyzer 2.51; the binary ships inside the tritonclient 2.51.0 wheel and
#                        needs libb64.so.0d (Debian/Ubuntu package libb64-0d) and libcudart.so.12 (pip package
#                        nvidia-cuda-runtime-cu12; no GPU is needed)
#   bin/tritonserver     Triton Inference Server 2.51 with its Python backend (CPU); the server ships inside the
#                        nvidia-pytriton 0.7.0 wheel
#   venv-pa/bin/python   a Python with tritonclient[all] 2.51 for client scripts
#   bin/model-analyzer   Triton's Model Analyzer (triton-model-analyzer from PyPI) in its own venv, venv-ma: its
#                        pins (a newer tritonclient, numba, optuna) stay out of Trireme's environment
# Safe to run again (finished parts are kept). The first run downloads about 700 MB.
#   bash tools/install-triton-tools.sh
#   ~/.cache/trireme/tools/bin/tritonserver --model-repository=DIR --grpc-port=P --http-port=Q
# Linux x86_64 only (those wheels exist for nothing else); exits non-zero when a tool cannot be made to run.
set -euo pipefail
DEST=${TRIREME_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/trireme/tools}
PY=${PYTHON:-python3}
TRITONCLIENT_VERSION=2.51.0
PYTRITON_VERSION=0.7.0
MODEL_ANALYZER_VERSION=1.58.0

say() { echo "install-triton-tools: $*" >&2; }

site_packages() {  # the purelib folder of a venv's python
  "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'
}

need_libb64() {  # perf_analyzer links libb64.so.0d; install the distribution package when it is missing
  ldconfig -p | grep -q 'libb64\.so\.0d' && return 0
  command -v apt-get >/dev/null || { say "libb64.so.0d missing and no apt-get: install libb64 yourself"; return 1; }
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get install -y -q libb64-0d >/dev/null 2>&1 \
    || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q libb64-0d >/dev/null; }
}

install_perf_analyzer() {
  local venv=$DEST/venv-pa
  if [ ! -x "$venv/bin/perf_analyzer" ]; then
    say "perf_analyzer + tritonclient $TRITONCLIENT_VERSION -> $venv"
    "$PY" -m venv "$venv"
    "$venv/bin/pip" install -q "tritonclient[all]==$TRITONCLIENT_VERSION" nvidia-cuda-runtime-cu12 numpy
  fi
  need_libb64
  local sp
  sp=$(site_packages "$venv")
  printf '#!/bin/sh\nexport LD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}\nexec %s "$@"\n' \
    "$sp/nvidia/cuda_runtime/lib" "$venv/bin/perf_analyzer" >"$DEST/bin/perf_analyzer"
  chmod +x "$DEST/bin/perf_analyzer"
  "$DEST/bin/perf_analyzer" --version >/dev/null 2>&1 || { say "perf_analyzer does not start"; return 1; }
}

install_tritonserver() {
  local venv=$DEST/venv-triton
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import pytriton' 2>/dev/null; then
    say "tritonserver (nvidia-pytriton $PYTRITON_VERSION) -> $venv"
    "$PY" -m venv "$venv"
    "$venv/bin/pip" install -q "nvidia-pytriton==$PYTRITON_VERSION" numpy
  fi
  local sp server pyver libdir backend
  sp=$(site_packages "$venv")
  server=$sp/pytriton/tritonserver
  pyver=$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  # the Python backend's stub must run with the libpython of the interpreter whose standard library it finds
  libdir=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')
  backend=$DEST/triton/backends/python
  mkdir -p "$backend"
  ln -sf "$server/backends/python/libtriton_python.so" "$backend/"
  ln -sf "$server/backends/python/triton_python_backend_utils.py" "$backend/"
  ln -sf "$server/python_backend_stubs/$pyver/triton_python_backend_stub" "$backend/"
  cat >"$DEST/bin/tritonserver" <<WRAPPER
#!/bin/sh
export LD_LIBRARY_PATH=$libdir:$sp/nvidia_pytriton.libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export PATH=$venv/bin:\$PATH
exec $server/bin/tritonserver --backend-directory=$DEST/triton/backends --cache-directory=$server/caches "\$@"
WRAPPER
  chmod +x "$DEST/bin/tritonserver"
  # --help exits 1 after printing the usage; a missing library prints a loader error instead
  local usage
  usage=$("$DEST/bin/tritonserver" --help 2>&1 || true)
  grep -q -- '--model-repository' <<<"$usage" || { say "tritonserver does not start: $usage"; return 1; }
}

install_model_analyzer() {
  local venv=$DEST/venv-ma
  if [ ! -x "$venv/bin/model-analyzer" ]; then
    say "triton-model-analyzer $MODEL_ANALYZER_VERSION -> $venv"
    "$PY" -m venv "$venv"
    "$venv/bin/pip" install -q "triton-model-analyzer==$MODEL_ANALYZER_VERSION"
  fi
  ln -sf "$venv/bin/model-analyzer" "$DEST/bin/model-analyzer"
  "$DEST/bin/model-analyzer" --help >/dev/null 2>&1 || { say "model-analyzer does not start"; return 1; }
}

mkdir -p "$DEST/bin"
install_perf_analyzer
install_tritonserver
install_model_analyzer
say "ready: $DEST/bin/perf_analyzer, $DEST/bin/tritonserver (Triton 2.51, Python backend, CPU), $DEST/bin/model-analyzer"
say "on a busy machine perf_analyzer often needs '-p 3000 -s 20 -r 20' to reach a stable measurement"
