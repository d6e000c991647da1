# syntax=docker/dockerfile:1.7
# The serving image: the NGC Triton TensorRT-LLM image (tritonserver, the tensorrtllm and python backends)
# plus engine_jobs: the launcher (`python -m engine_jobs serve`), the model-repository generator and the
# acceptance-metering, pre- and post-processing Python models. Same TRITON_RELEASE as the builder.
# Build from the repository root:  docker build -f images/triton-runtime.Dockerfile -t IMAGE .
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
ARG TRITON_RELEASE=26.07

FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY engine_jobs/ engine_jobs/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# The PyTorch path's engine model is Triton's llmapi Python model, which TensorRT-LLM keeps in its repository
# (triton_backend/all_models/llmapi/tensorrt_llm/1: model.py, helpers.py). Take it from the release tag that
# matches the installed package; the launcher copies it next to the model.yaml it generates.
FROM alpine/git:v2.49.1 AS trtllm-llmapi
ARG TRTLLM_VERSION=1.2.1
RUN git clone --depth 1 --branch "v${TRTLLM_VERSION}" --filter=blob:none --sparse \
        https://github.com/NVIDIA/TensorRT-LLM.git /src \
    && git -C /src sparse-checkout set triton_backend/all_models/llmapi

FROM nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-trtllm-python-py3
ARG TRITON_RELEASE=26.07
ARG TRTLLM_VERSION=1.2.1
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="redrafter-triton-runtime" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.base.name="nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-trtllm-python-py3" \
      dev.redrafter.tensorrt-llm.version="${TRTLLM_VERSION}"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# NGC's Ubuntu 24.04 Python is "externally managed"; engine_jobs is added next to TensorRT-LLM on purpose.
ENV PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 HOME=/tmp
COPY images/requirements/triton-runtime.txt /tmp/requirements.txt
COPY --from=wheel /wheels /tmp/wheels
# engine_jobs.serve LaunchSettings.llmapi_model_dir
COPY --from=trtllm-llmapi /src/triton_backend/all_models/llmapi/tensorrt_llm/1/ /opt/redrafter/llmapi/
RUN python3 -m pip install --no-cache-dir --requirement /tmp/requirements.txt \
    && python3 -m pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels /tmp/requirements.txt \
    && if ! command -v python >/dev/null; then ln -s "$(command -v python3)" /usr/local/bin/python; fi \
    && test -x /opt/tritonserver/bin/tritonserver \
    && installed="$(python3 -c 'import importlib.metadata as m; print(m.version("tensorrt_llm"))')" \
    && if [ "${installed}" != "${TRTLLM_VERSION}" ]; then echo "base image has TensorRT-LLM ${installed}, expected ${TRTLLM_VERSION}" >&2; exit 1; fi \
    && test -d /opt/tritonserver/backends/tensorrtllm \
    && test -f /opt/redrafter/llmapi/model.py \
    && groupadd --gid 10001 redrafter \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin redrafter
USER 10001:10001
WORKDIR /tmp
# HTTP, gRPC, metrics, OpenAI-compatible API (engine_jobs.contract)
EXPOSE 8000 8001 8002 9000
ENTRYPOINT []
CMD ["python3", "-m", "engine_jobs", "serve", "--config", "/etc/redrafter/serving.json"]
