# The aivitals agent (exporter mode on Kubernetes: deploy/kubernetes/agent-daemonset.yaml).
# Build from the repository root:
#   podman build -f deploy/docker/agent.Dockerfile -t aivitals-agent:0.1.0 .
# NVML comes from the node's driver, put in the container by the NVIDIA runtime; the
# image carries only nvidia-ml-py (the `gpu` extra), never CUDA.
ARG PYTHON_IMAGE=docker.io/library/python:3.11-slim

FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir "$(ls /wheels/aivitals-*.whl)[gpu]" && rm -rf /wheels
EXPOSE 9478
# --allow-remote: inside a pod the API must listen beyond loopback; it stays read-only.
ENTRYPOINT ["aivitals"]
CMD ["agent", "--exporter", "--listen=0.0.0.0:9478", "--allow-remote", "--gpu=auto"]
