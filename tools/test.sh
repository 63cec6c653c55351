#!/usr/bin/env bash
# The test command of the README: creates .venv if needed, installs Trireme with its test extras, runs the
# proto drift check, the linters and the whole test suite. Works on a fresh machine (pip registry only; two
# Debian packages through apt-get need root or sudo, and the tests that use them skip without them).
# Prints one line per step ("[test.sh] ..."), so a quiet pip is not mistaken for a hang.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
step() { echo "[test.sh] $*"; }

if [ ! -x .venv/bin/python ]; then
  step "creating .venv with $PY"
  "$PY" -m venv .venv
fi
step "pip: upgrading pip in .venv"
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
step "pip: Trireme with the dev, plot and openai extras (pytest, ruff, mypy, tritonclient, matplotlib, ...)"
.venv/bin/python -m pip install -q -e ".[dev,plot,openai]"
# optional framework backends: the CPU torch wheel (never a CUDA build from the index) and onnxruntime
step "pip: torch (CPU build) for the pytorch backend tests"
.venv/bin/python -m pip install -q "torch==2.13.0+cpu" 2>/dev/null \
  || .venv/bin/python -m pip install -q --index-url https://download.pytorch.org/whl/cpu torch 2>/dev/null \
  || echo "note: torch not installable here; pytorch backend tests will be skipped"
step "pip: onnx and onnxruntime for the onnxruntime backend tests"
.venv/bin/python -m pip install -q onnx onnxruntime 2>/dev/null || echo "note: onnxruntime not installable; skipped"
step "pip: the fil and openvino extras (tree models, OpenVINO; about 10 s from a warm pip cache)"
.venv/bin/python -m pip install -q -e ".[fil,openvino]" 2>/dev/null \
  || echo "note: the fil/openvino extras are not installable here; their tests are skipped"
step "pip: the tensorflow extra (tensorflow-cpu: a 274 MB wheel, about 25 s to install from a local copy)"
.venv/bin/python -m pip install -q -e ".[tensorflow]" 2>/dev/null \
  || echo "note: tensorflow-cpu not installable here; tensorflow backend tests will be skipped"
step "pip: the envs extra (uv) and venv-pack, for the per-model Python environment tests"
.venv/bin/python -m pip install -q -e ".[envs]" venv-pack 2>/dev/null \
  || echo "note: uv/venv-pack not installable here; tests/integration/test_python_envs.py will be skipped"
step "pip: the grpc-native extra (pygrpc-native: --grpc-transport=native, docs/grpc.md)"
.venv/bin/python -m pip install -q -e ".[grpc-native]" 2>/dev/null \
  || echo "note: pygrpc-native not installable here; the native gRPC transport tests are skipped"
# real perf_analyzer + Triton 2.51 for the compatibility tests (tools/install-triton-tools.sh, into $TRIREME_TOOLS,
# default ~/.cache/trireme/tools; those tests skip when the tools cannot be installed here).
# TRIREME_SKIP_ANCHORS=1 skips the download.
if [ -z "${TRIREME_SKIP_ANCHORS:-}" ]; then
  step "tools: perf_analyzer and Triton 2.51 (about 700 MB the first time; apt-get libb64-0d, needs root or sudo)"
  bash tools/install-triton-tools.sh >/dev/null 2>&1 \
    || echo "note: perf_analyzer/tritonserver could not be installed (tools/install-triton-tools.sh); those tests skip"
else
  step "tools: skipped (TRIREME_SKIP_ANCHORS is set); the perf_analyzer/Triton comparison tests skip"
fi
# ApacheBench (`ab`) for the HTTP load compatibility test (skipped without it); only as root with apt, never fatal
if ! command -v ab >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    step "apt-get: apache2-utils (ab) for the HTTP load comparison test"
    { apt-get install -y -q apache2-utils >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q apache2-utils >/dev/null 2>&1; }; } \
      || echo "note: apache2-utils (ab) not installable; the ab test skips"
  else
    step "apt-get: apache2-utils (ab) not installed (needs root); the ab test skips"
  fi
fi
# cloud model repositories (docs/cloud-repositories.md): the s3/gcs/azure extras, moto's S3 server and a GCS
# emulator from PyPI, Azurite (Azure Blob emulator) from npm into $TRIREME_TOOLS/npm; their tests skip without them
step "pip: the s3, gcs and azure extras, moto[server] and gcp-storage-emulator (cloud repository tests)"
.venv/bin/python -m pip install -q -e ".[s3,gcs,azure]" "moto[server]>=5" "gcp-storage-emulator>=2024" 2>/dev/null \
  || echo "note: the cloud storage clients or emulators are not installable here; their tests skip"
if command -v npm >/dev/null 2>&1; then
  step "npm: azurite (the Azure Blob emulator) into \$TRIREME_TOOLS/npm"
  npm install --silent --prefix "${TRIREME_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/trireme/tools}/npm" azurite \
    >/dev/null 2>&1 || echo "note: azurite not installable (npm); the Azure repository tests skip"
else
  step "npm: not found; the Azure repository tests (Azurite) skip"
fi
# Redis for the Redis response cache tests (tests/integration/test_redis_cache.py, skipped without them): the
# redis client (the trireme[redis] extra) and the Debian redis-server, only as root with apt, never fatal
step "pip: the redis extra (the Redis response cache's client)"
.venv/bin/python -m pip install -q -e ".[redis]" 2>/dev/null || echo "note: redis not installable; the Redis cache tests skip"
if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    step "apt-get: redis-server for the Redis response cache tests"
    { apt-get install -y -q redis-server >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q redis-server >/dev/null 2>&1; }; } \
      || echo "note: redis-server not installable; the Redis cache tests skip"
  else
    step "apt-get: redis-server not installed (needs root); the Redis cache tests skip"
  fi
fi
# the compiled build (mypyc, in place: service/compiled.py lists the modules): the first pytest pass runs it, the
# second forces pure Python (TRIREME_PURE_PYTHON=1), so both builds are tested. A failed compile fails the run.
# TRIREME_COMPILED=0 skips it (both passes then run pure Python).
if [ "${TRIREME_COMPILED:-1}" != 0 ]; then
  step "mypyc: compiling the hot path (tools/build_compiled.py; about 45 CPU-seconds)"
  compile_start=$(date +%s)
  .venv/bin/python tools/build_compiled.py >/dev/null
  step "mypyc: compiled in $(( $(date +%s) - compile_start )) s"
  export TRIREME_EXPECT_COMPILED=1  # tests/integration/test_compiled_build.py: it must be in use
else
  step "mypyc: skipped (TRIREME_COMPILED=0); both passes run pure Python"
  .venv/bin/python tools/build_compiled.py --clean >/dev/null
fi
step "checking the generated protobuf code (tools/gen_protos.py --check)"
.venv/bin/python tools/gen_protos.py --check
step "ruff check"
.venv/bin/ruff check .
step "ruff format --check"
.venv/bin/ruff format --check .
step "mypy"
.venv/bin/mypy
# the layer rule (pyproject.toml [tool.importlinter]) and no import circles (docs/architecture.md)
step "lint-imports (the layer rule)"
.venv/bin/lint-imports
step "import circles (tools/check_cycles.py)"
.venv/bin/python tools/check_cycles.py
# the container image: built and smoke-tested when a container engine works here (else one "SKIPPED" line);
# TRIREME_IMAGE_TEST=0 turns it off; bounded by TRIREME_IMAGE_TIMEOUT seconds (a cold layer cache can need more:
# then it says so and does not fail the run)
if [ "${TRIREME_IMAGE_TEST:-1}" != 0 ]; then
  step "container image: build and smoke test (tools/build-image.sh --ci)"
  image_rc=0
  PYTHON=.venv/bin/python timeout "${TRIREME_IMAGE_TIMEOUT:-900}" bash tools/build-image.sh --ci || image_rc=$?
  if [ "$image_rc" = 124 ]; then
    echo "[build-image] SKIPPED: not done within ${TRIREME_IMAGE_TIMEOUT:-900} s (cold layer cache?); run tools/build-image.sh"
  elif [ "$image_rc" != 0 ]; then
    exit "$image_rc"
  fi
else
  step "container image: skipped (TRIREME_IMAGE_TEST=0)"
fi
# The whole suite runs twice, both passes at once: they mostly wait on server start-ups and worker processes, so
# side by side on 2 cores the two take about a third longer than the longer one alone, not twice as long, and CI
# stays well under 40 minutes:
# - pass 1: the compiled build (unless TRIREME_COMPILED=0), default settings: one front-end process, gRPC on the
#   default transport (h2, Trireme's own); every test;
# - pass 2: the same suite with two front-end processes in front of one core process (--frontend-processes 2; the
#   flag's default comes from TRIREME_FRONTEND_PROCESSES), on the pure-Python build (TRIREME_PURE_PYTHON=1: the
#   compiled .so files stay beside the sources, service/compiled.py's finder ignores them in every process it
#   starts), gRPC on grpcio. Tests marked single_pass (framework backends, cloud storage services, per-model
#   environments, fresh-venv installs: nothing in them changes with the build or the front-end mode, and the paths
#   they share with the rest run in both passes) and benchmarks run in pass 1 only.
# So everything a client sees holds both ways, on both builds, and each gRPC transport has the whole suite once
# (test_grpc_transport.py and test_grpc_h2_*.py run every transport in both passes). Both passes share this
# checkout and the machine: the tests' ports (tests/ports.py), shared-memory keys and temporary names are their
# own, and the few whose client uses perf_analyzer's fixed segment names take a machine-wide lock
# (tests/conftest.py, machine_wide_shm_names). Pass 2 writes to a log file, printed when pass 1 has ended.
# TRIREME_SECOND_PASS=0 skips pass 2. The run fails if either pass fails.
second_pid=""
second_log=""
if [ "${TRIREME_SECOND_PASS:-1}" != 0 ]; then
  second_log=$(mktemp "${TMPDIR:-/tmp}/trireme-pass2.XXXXXX")
  second_pass() {
    local start rc=0
    start=$(date +%s)
    step "pytest pass 2 started in the background: two front-end processes, pure Python, grpcio (TRIREME_FRONTEND_PROCESSES=2 TRIREME_PURE_PYTHON=1 TRIREME_GRPC_TRANSPORT=grpcio) -m \"not benchmark and not single_pass\" $*; output to $second_log"
    TRIREME_FRONTEND_PROCESSES=2 TRIREME_PURE_PYTHON=1 TRIREME_GRPC_TRANSPORT=grpcio \
      .venv/bin/python -m pytest -q -m "not benchmark and not single_pass" "$@" >"$second_log" 2>&1 || rc=$?
    echo "$rc $(( $(date +%s) - start ))" >"$second_log.status"
    return "$rc"
  }
  second_pass "$@" &
  second_pid=$!
  # stopped with the script (Ctrl-C, a CI timeout, a failed step): pass 2's pytest too, not left running
  trap 'if kill -0 "$second_pid" 2>/dev/null; then pkill -TERM -P "$second_pid" 2>/dev/null; kill "$second_pid" 2>/dev/null; fi' EXIT
fi
first_start=$(date +%s)
first_rc=0
step "pytest pass 1: the compiled build (unless TRIREME_COMPILED=0), default settings $*"
.venv/bin/python -m pytest -q "$@" || first_rc=$?
first_s=$(( $(date +%s) - first_start ))
step "pytest pass 1 ended: exit code $first_rc after $first_s s"
if [ -n "$second_pid" ]; then
  if kill -0 "$second_pid" 2>/dev/null; then
    step "waiting for pytest pass 2 (running in the background)"
  fi
  wait "$second_pid" || true
  read -r second_rc second_s 2>/dev/null <"$second_log.status" || { second_rc=1; second_s="?"; }
  step "pytest pass 2 output (two front-end processes, pure Python, grpcio):"
  cat "$second_log"
  rm -f "$second_log" "$second_log.status"
  step "pytest pass 1 (compiled, defaults): exit code $first_rc, $first_s s; pass 2 (two front-end processes, pure Python, grpcio): exit code $second_rc, $second_s s"
  if [ "$first_rc" != 0 ] || [ "$second_rc" != 0 ]; then
    exit 1
  fi
else
  step "pytest pass 2: skipped (TRIREME_SECOND_PASS=0)"
fi
exit "$first_rc"
