# syntax=docker/dockerfile:1.7
# The engine builder run by build Jobs (`python -m engine_jobs build --spec /etc/redrafter/build.json`):
# the NGC Triton TensorRT-LLM image (TensorRT-LLM's converters and trtllm-build) plus engine_jobs with the
# `builder` extra. It MUST use the same TRITON_RELEASE as triton-runtime.Dockerfile: an engine only loads
# in the TensorRT-LLM version that built it (see images/README.md for the pairing).
# Build from the repository root:  docker build -f images/engine-builder.Dockerfile -t IMAGE .
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
ARG TRITON_RELEASE=26.07

FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY engine_jobs/ engine_jobs/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# The NGC trtllm image ships the tensorrt_llm package and trtllm-build but not TensorRT-LLM's examples/
# (the converters engine_jobs runs). Take them from the release tag that matches the installed package.
FROM alpine/git:v2.49.1 AS trtllm-examples
ARG TRTLLM_VERSION=1.2.1
RUN git clone --depth 1 --branch "v${TRTLLM_VERSION}" --filter=blob:none --sparse \
        https://github.com/NVIDIA/TensorRT-LLM.git /src \
    && git -C /src sparse-checkout set examples

FROM nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-trtllm-python-py3
ARG TRITON_RELEASE=26.07
ARG TRTLLM_VERSION=1.2.1
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="redrafter-engine-builder" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.base.name="nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-trtllm-python-py3" \
      dev.redrafter.tensorrt-llm.version="${TRTLLM_VERSION}"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# NGC's Ubuntu 24.04 Python is "externally managed"; engine_jobs is added next to TensorRT-LLM on purpose.
ENV PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 HOME=/tmp HF_HOME=/tmp/huggingface
COPY images/requirements/engine-builder.txt /tmp/requirements.txt
COPY --from=wheel /wheels /tmp/wheels
# engine_jobs' default REDRAFTER_TRTLLM_EXAMPLES
COPY --from=trtllm-examples /src/examples /app/tensorrt_llm/examples
RUN python3 -m pip install --no-cache-dir --requirement /tmp/requirements.txt \
    && python3 -m pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels /tmp/requirements.txt \
    && if ! command -v python >/dev/null; then ln -s "$(command -v python3)" /usr/local/bin/python; fi \
    && installed="$(python3 -c 'import importlib.metadata as m; print(m.version("tensorrt_llm"))')" \
    && if [ "${installed}" != "${TRTLLM_VERSION}" ]; then echo "base image has TensorRT-LLM ${installed}, expected ${TRTLLM_VERSION}" >&2; exit 1; fi \
    && groupadd --gid 10001 redrafter \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin redrafter
USER 10001:10001
WORKDIR /tmp
ENTRYPOINT []
CMD ["python3", "-m", "engine_jobs", "build", "--spec", "/etc/redrafter/build.json"]
