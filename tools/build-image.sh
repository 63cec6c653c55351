#!/usr/bin/env bash
# Builds the Trireme container image, starts the server from it with a model repository mounted, and smoke-tests
# it with tritonclient; prints the image size and the start time.
#
#   tools/build-image.sh                 # build + smoke test (CPU image, tag localhost/trireme:cpu)
#   tools/build-image.sh --ci            # the same, but exit 0 with a "skipped" line when no engine is usable
#   tools/build-image.sh --base-only     # only make sure a base image exists
#
# Environment: TRIREME_IMAGE (tag), TRIREME_BASE_IMAGE (base to pull, default python:3.11-slim),
# TRIREME_SHM_SIZE (the /dev/shm the smoke test gives the container, default 64m = Docker's default),
# PYTHON (an interpreter with tritonclient for the smoke test, default .venv/bin/python).
#
# When the base cannot be pulled (no registry reachable) and debootstrap is installed, a Debian bookworm base is
# made with debootstrap from the Debian mirror this machine's apt already uses. When `podman run` cannot start
# containers here (some sandboxes refuse the OCI runtime), the image is run by `podman image mount` + chroot in a
# private mount namespace with /proc, /dev and a /dev/shm tmpfs of TRIREME_SHM_SIZE mounted.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

MODE=${1:-}
IMAGE=${TRIREME_IMAGE:-localhost/trireme:cpu}
PULL_BASE=${TRIREME_BASE_IMAGE:-docker.io/library/python:3.11-slim}
DEBIAN_BASE=localhost/debian-base:bookworm
SHM_SIZE=${TRIREME_SHM_SIZE:-64m}
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3

say() { echo "[build-image] $*"; }
skip() {
  if [ "$MODE" = "--ci" ]; then
    say "SKIPPED: $*"
    exit 0
  fi
  say "error: $*" >&2
  exit 3
}

# ---- container engine ------------------------------------------------------------------------------------------
ENGINE=""
for candidate in podman docker; do
  if command -v "$candidate" >/dev/null 2>&1 && timeout 30 "$candidate" info >/dev/null 2>&1; then
    ENGINE=$candidate
    break
  fi
done
[ -n "$ENGINE" ] || skip "no usable container engine (podman or docker with a running daemon); the image test did not run"
say "engine: $ENGINE"

image_exists() { "$ENGINE" image inspect "$1" >/dev/null 2>&1; }

# ---- base image ------------------------------------------------------------------------------------------------
debian_mirror() {
  # the first Debian archive (not the security one) named in this machine's apt sources, deb822 or one-line form
  {
    grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{for (i = 2; i <= NF; i++) print $i}'
    grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{print ($2 ~ /^\[/) ? $3 : $2}'
  } | grep -v -- '-security' | grep -m1 '/debian/\?$' || true
}

make_debian_base() {
  command -v debootstrap >/dev/null 2>&1 || skip "base image $PULL_BASE cannot be pulled and debootstrap is not installed"
  local mirror dir
  mirror=$(debian_mirror)
  [ -n "$mirror" ] || skip "base image $PULL_BASE cannot be pulled and no Debian mirror is configured for apt"
  dir=$(mktemp -d /var/tmp/trireme-base.XXXXXX)
  say "making $DEBIAN_BASE with debootstrap from $mirror (a few minutes, once)"
  nice -n 10 debootstrap --variant=minbase bookworm "$dir" "$mirror" >"$dir.log" 2>&1 \
    || { tail -20 "$dir.log" >&2; rm -rf "$dir" "$dir.log"; skip "debootstrap failed"; }
  rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
  # RUN steps use the same mirror as apt here
  echo "deb $mirror bookworm main" >"$dir/etc/apt/sources.list"
  tar -C "$dir" -c . | "$ENGINE" import - "$DEBIAN_BASE" >/dev/null 2>&1
  rm -rf "$dir" "$dir.log"
}

BASE=$PULL_BASE
if ! image_exists "$BASE"; then
  if image_exists "$DEBIAN_BASE"; then
    BASE=$DEBIAN_BASE
  elif timeout 120 "$ENGINE" pull -q "$PULL_BASE" >/dev/null 2>&1; then
    BASE=$PULL_BASE
  else
    say "cannot pull $PULL_BASE (no registry reachable?)"
    make_debian_base
    BASE=$DEBIAN_BASE
  fi
fi
say "base: $BASE"
[ "$MODE" = "--base-only" ] && exit 0

# ---- build -----------------------------------------------------------------------------------------------------
BUILD_ARGS=(--build-arg "BASE_IMAGE=$BASE" -f Dockerfile)
if [ "$ENGINE" = podman ]; then
  # docker format keeps HEALTHCHECK; chroot isolation works where the OCI runtime cannot start containers
  BUILD_ARGS+=(--format docker --isolation=chroot)
fi
# this machine's own pip settings are lent to the build: a local wheel folder or file:// indexes (mounted read-only
# at the same path) and the CA bundle pip trusts (e.g. a TLS-intercepting proxy's). Build-time mounts are podman's.
if [ "$ENGINE" = podman ]; then
  pip_setting() { "$PY" -m pip config get "global.$1" 2>/dev/null || true; }
  FIND_LINKS=${PIP_FIND_LINKS:-$(pip_setting find-links)}
  if [ -n "$FIND_LINKS" ] && [ -d "$FIND_LINKS" ]; then
    BUILD_ARGS+=(-v "$FIND_LINKS:$FIND_LINKS:ro" --build-arg "PIP_FIND_LINKS=$FIND_LINKS")
  fi
  LOCAL_INDEXES=""
  for url in ${PIP_EXTRA_INDEX_URL:-$(pip_setting extra-index-url)}; do
    dir=${url#file://}
    if [ "$dir" != "$url" ] && [ -d "$dir" ]; then
      dir=${dir%/}
      [ "$(basename "$dir")" != simple ] || dir=$(dirname "$dir")  # a simple index links to files beside it
      BUILD_ARGS+=(-v "$dir:$dir:ro")
      LOCAL_INDEXES="$LOCAL_INDEXES $url"
    fi
  done
  [ -z "$LOCAL_INDEXES" ] || BUILD_ARGS+=(--build-arg "PIP_EXTRA_INDEXES=${LOCAL_INDEXES# }")
  CERT=${PIP_CERT:-$(pip_setting cert)}
  if [ -n "$CERT" ] && [ -f "$CERT" ]; then
    BUILD_ARGS+=(-v "$(dirname "$CERT"):/run/pip-certs:ro" --build-arg "PIP_CERT_PATH=/run/pip-certs/$(basename "$CERT")")
  fi
fi
if ! timeout 10 "$PY" -c "import urllib.request as u; u.urlopen('https://download.pytorch.org/whl/cpu/', timeout=8)" \
  >/dev/null 2>&1; then
  BUILD_ARGS+=(--build-arg TORCH_INDEX_URL=)  # unreachable: the CPU wheel must come from the lent sources
fi
say "building $IMAGE"
t0=$(date +%s)
nice -n 10 "$ENGINE" build "${BUILD_ARGS[@]}" -t "$IMAGE" . >/tmp/trireme-build-image.log 2>&1 \
  || { tail -40 /tmp/trireme-build-image.log >&2; say "error: build failed (full log /tmp/trireme-build-image.log)"; exit 1; }
say "built in $(($(date +%s) - t0)) s"
# the build stage gets a tag too (all cached: seconds), so that pruning untagged images removes what earlier builds
# left behind but keeps this build's layer cache (torch, dependencies) for the next one; CI prunes, so that runs
# on one machine do not fill its disk (a developer's other untagged images are left alone)
"$ENGINE" build "${BUILD_ARGS[@]}" --target build -t "$IMAGE-build-stage" . >/dev/null 2>&1 || true
if [ "$MODE" = "--ci" ]; then
  "$ENGINE" image prune -f >/dev/null 2>&1 || true
fi
SIZE=$("$ENGINE" image inspect --format '{{.Size}}' "$IMAGE")
say "image size: $((SIZE / 1000000)) MB ($SIZE bytes)"

# ---- run + smoke test ------------------------------------------------------------------------------------------
# the example repository, plus the TorchScript example when this machine has torch to generate it (torch in the image)
REPO=$(mktemp -d /tmp/trireme-smoke-repo.XXXXXX)
trap 'rm -rf "$REPO"' EXIT
cp -r service/example_models/. "$REPO/"
"$PY" tools/make_example_models.py --repository "$REPO" >/dev/null 2>&1 || say "no torch here: fc_model_pt not in the smoke test"
chmod -R a+rX "$REPO"  # the image's user (uid 1000) reads it
"$PY" "$ROOT/tools/image_smoke.py" --engine "$ENGINE" --image "$IMAGE" --shm-size "$SHM_SIZE" --model-repository "$REPO"
