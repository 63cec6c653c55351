# Trireme CPU image (the GPU variant is Dockerfile.gpu; docs/deploy.md explains both).
#
#   docker build -t trireme:cpu .                       # or tools/build-image.sh: build + smoke test
#   docker run --shm-size=1g -p 8000:8000 -p 8001:8001 -p 8002:8002 -v $PWD/models:/models:ro trireme:cpu
#
# The model repository is a volume mounted at /models. BASE_IMAGE is any Debian-based image: one with Python 3.11
# (python:3.11-slim) or a bare Debian bookworm (its python3 is installed). Every Python package is pinned by
# deploy/constraints.txt; torch is the CPU build (TORCH_VERSION from TORCH_INDEX_URL and/or PIP_FIND_LINKS).
ARG BASE_IMAGE=python:3.11-slim

# ---- build stage: a virtual environment with Trireme and its CPU backends ---------------------------------------
FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DEBIAN_FRONTEND=noninteractive
RUN if ! command -v python3 >/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
      && rm -rf /var/lib/apt/lists/*; \
    fi
# a C compiler and Python's headers for the compiled build (mypyc), in this stage only
RUN python3 -c "import os, sysconfig; os.stat(sysconfig.get_paths()['include'] + '/Python.h')" 2>/dev/null \
      && pkgs="gcc libc6-dev" || pkgs="gcc libc6-dev python3-dev"; \
    apt-get update && apt-get install -y --no-install-recommends $pkgs && rm -rf /var/lib/apt/lists/*
ARG TORCH_VERSION=2.13.0+cpu
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# where pip finds packages besides PyPI (a local wheel folder, local indexes) and a CA bundle for a TLS proxy;
# tools/build-image.sh lends the building machine's own pip settings here. Used by this stage only.
ARG PIP_FIND_LINKS=
ARG PIP_EXTRA_INDEXES=
ARG PIP_CERT_PATH=
RUN python3 -m venv /opt/trireme \
 && { echo "[global]"; \
      if [ -n "$PIP_CERT_PATH" ]; then echo "cert = $PIP_CERT_PATH"; fi; \
      if [ -n "$PIP_FIND_LINKS" ]; then echo "find-links = $PIP_FIND_LINKS"; fi; \
      if [ -n "$TORCH_INDEX_URL$PIP_EXTRA_INDEXES" ]; then echo "extra-index-url = $TORCH_INDEX_URL $PIP_EXTRA_INDEXES"; fi; \
    } > /etc/pip.conf
ENV PATH=/opt/trireme/bin:$PATH
WORKDIR /src
# dependencies first, torch alone (their layers are reused while only the source or the other deps change)
COPY deploy/constraints.txt ./
RUN pip install -c constraints.txt "torch==${TORCH_VERSION}"
COPY pyproject.toml ./
RUN python3 -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\\n'.join(p['dependencies'] + p['optional-dependencies']['onnx']))" > requirements.txt \
 && pip install -c constraints.txt -r requirements.txt
COPY README.md ./
COPY protos ./protos
COPY service ./service
COPY shm ./shm
COPY load ./load
COPY tools/make_example_models.py tools/build_compiled.py tools/build_backend.py ./tools/
COPY setup.py ./
# the seed TorchScript example is generated, then packaged with the other example models; the image ships the
# compiled build (TRIREME_COMPILE=1: the hot path compiled with mypyc, a failed compile fails the build;
# TRIREME_PURE_PYTHON=1 at `docker run` forces pure Python); torch's C++ headers and test binaries (about
# 145 MB) are not needed to serve
RUN python3 tools/make_example_models.py \
 && TRIREME_COMPILE=1 pip install -c constraints.txt --no-deps . \
 && (cd / && trireme --version | grep -q "compiled with mypyc") \
 && rm -rf /opt/trireme/lib/python3*/site-packages/torch/include /opt/trireme/lib/python3*/site-packages/torch/test

# ---- runtime stage: the environment and an interpreter, nothing else ----------------------------------------------
FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
RUN if ! command -v python3 >/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends python3 \
      && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*; \
    fi \
 && useradd --system --uid 1000 --user-group --home-dir /home/trireme --create-home trireme \
 && mkdir -p /models
COPY --from=build /opt/trireme /opt/trireme
ENV PATH=/opt/trireme/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MALLOC_MMAP_THRESHOLD_=536870912 \
    MALLOC_TRIM_THRESHOLD_=536870912
USER 1000:1000
WORKDIR /home/trireme
VOLUME ["/models"]
# HTTP/REST, gRPC, Prometheus metrics (Triton's ports)
EXPOSE 8000 8001 8002
# healthy = GET /v2/health/ready answers 200 (server and models ready); assumes the default HTTP port 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=4)"]
ENTRYPOINT ["trireme", "serve"]
CMD ["--model-repository=/models"]
