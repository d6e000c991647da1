# syntax=docker/dockerfile:1.7
# The operator: slim Python 3.11, the redrafter-operator distribution and its pinned dependencies only,
# running as an unprivileged numeric user (the chart adds a read-only root filesystem and a /tmp emptyDir).
# Build from the repository root:  docker build -f images/operator.Dockerfile -t IMAGE .
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY engine_jobs/ engine_jobs/
COPY images/requirements/operator.txt /tmp/requirements.txt
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --requirement /tmp/requirements.txt \
    && /opt/venv/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /tmp/wheels . \
    && /opt/venv/bin/pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
    && /opt/venv/bin/redrafter-operator --version

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="redrafter-operator" \
      org.opencontainers.image.description="Kubernetes operator for ReDrafter speculative decoding with TensorRT-LLM and Triton" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/redrafter/redrafter-operator"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp
COPY --from=build /opt/venv /opt/venv
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["redrafter-operator"]
CMD ["run", "--all-namespaces", "--standalone", "--liveness=http://0.0.0.0:8080/healthz"]
