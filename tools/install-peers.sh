#!/usr/bin/env bash
# Installs the serving frameworks that tests/bench/peers/ compares Trireme with, each into its own virtualenv
# under ~/.cache/trireme/peers/<name> (MLServer, Ray and BentoML pin grpcio/protobuf versions that would clash with
# Trireme's own environment). pip only; idempotent (an existing venv with its marker file is left alone; pass
# --force to rebuild). Benchmarks only: CI never runs this.
set -euo pipefail

ROOT="${TRIREME_PEERS_DIR:-$HOME/.cache/trireme/peers}"
PYTHON="${PYTHON:-python3.11}"
FORCE=0
[[ "${1:-}" == "--force" ]] && { FORCE=1; shift; }

# name -> pip requirements (versions pinned so that a rerun measures the same servers)
declare -A PEERS=(
  [fastapi]="fastapi==0.165.0 uvicorn[standard]==0.54.0"
  [mlserver]="mlserver==1.7.1 uvloop==0.21.0"  # MLServer 1.7.1's inference workers fail on uvloop 0.22+
  [litserve]="litserve==0.2.19"
  [rayserve]="ray[serve]==2.60.0"
  [bentoml]="bentoml==1.4.40"
)
# each server trains the same small model from a fixed seed at start-up, so scikit-learn versions may differ
COMMON="scikit-learn"

install_one() {
  local name="$1" venv="$ROOT/$1"
  if [[ $FORCE == 0 && -f "$venv/.installed" ]]; then
    echo "$name: present ($venv)"
    return 0
  fi
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  # shellcheck disable=SC2086
  "$venv/bin/python" -m pip install -q ${PEERS[$name]} $COMMON
  "$venv/bin/python" -m pip freeze >"$venv/.installed"
  echo "$name: installed ($venv)"
}

mkdir -p "$ROOT"
names=("$@")
[[ ${#names[@]} == 0 ]] && names=(fastapi mlserver litserve rayserve bentoml)
status=0
for name in "${names[@]}"; do
  if [[ -z "${PEERS[$name]+x}" ]]; then
    echo "unknown peer '$name' (known: ${!PEERS[*]})" >&2
    exit 2
  fi
  install_one "$name" || { echo "$name: install FAILED" >&2; status=1; }
done
# The load generator: wrk (Debian package), used for every server alike.
command -v wrk >/dev/null || echo "wrk not found: apt-get install wrk" >&2
exit $status
