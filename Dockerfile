# CPU image of Trireme: `docker build -t trireme . && docker run -p 8001:8001 trireme`
# (installed editable so the generated example model under service/example_models is the one served)
# Mount a Triton model repository with `-v /models:/models` and pass `--model-repository /models`.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    MALLOC_MMAP_THRESHOLD_=67108864 \
    MALLOC_TRIM_THRESHOLD_=536870912

WORKDIR /opt/trireme
COPY pyproject.toml README.md ./
COPY protos ./protos
COPY service ./service
COPY shm ./shm
COPY load ./load
COPY tools ./tools
# the CPU build of torch (the default index serves CUDA builds) and onnxruntime for the framework backends
RUN pip install --upgrade pip \
 && pip install --index-url https://download.pytorch.org/whl/cpu torch \
 && pip install -e ".[onnx]"
# the seed TorchScript example is generated, not checked in
RUN python tools/make_example_models.py

EXPOSE 8001
ENTRYPOINT ["trireme", "serve", "--grpc-address", "0.0.0.0", "--grpc-port", "8001"]
