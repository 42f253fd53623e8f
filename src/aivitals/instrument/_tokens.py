"""Counting tokens on what the model actually receives and produces.

Works on lists, numpy arrays, torch tensors and Hugging Face ``BatchEncoding``
without importing numpy or torch: it asks the object, by duck typing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError

__all__ = ["count_tokens"]

_MAX_DEPTH = 8


def count_tokens(ids: Any) -> int:
    """The number of tokens in ``ids``; padding excluded when an attention mask says so.

    ``ids`` may be an int (a count), a list of ids or of lists (a batch), a
    numpy array, a torch tensor, or a mapping with ``input_ids`` (and
    ``attention_mask``, which then decides: padded positions are not tokens).

    **Usage**::

        count_tokens([[101, 2009, 102], [101, 102]])   # 5
    """
    return _count(ids, 0)


def _count(ids: Any, depth: int) -> int:
    if depth > _MAX_DEPTH:
        raise ConfigError("token ids nest deeper than 8 levels; pass input_ids, not a structure")
    if isinstance(ids, bool):
        raise ConfigError(f"token ids must be ids or a count, got {ids!r}")
    if isinstance(ids, int):
        if ids < 0:
            raise ConfigError(f"a token count cannot be negative, got {ids!r}")
        return ids
    if isinstance(ids, str | bytes):
        raise ConfigError(
            "token counts come from the ids the model receives, not from text: "
            f"got a {type(ids).__name__} of length {len(ids)}"
        )
    if isinstance(ids, Mapping) or (hasattr(ids, "keys") and hasattr(ids, "__getitem__")):
        return _count_encoding(ids, depth)
    numel = getattr(ids, "numel", None)
    if callable(numel):  # torch.Tensor
        return int(numel())
    size = getattr(ids, "size", None)
    if isinstance(size, int) and hasattr(ids, "shape"):  # numpy.ndarray
        return size
    if isinstance(ids, list | tuple):
        if all(isinstance(x, int) and not isinstance(x, bool) for x in ids):
            return len(ids)
        return sum(_count(x, depth + 1) for x in ids)
    raise ConfigError(f"cannot count tokens in a {type(ids).__name__}")


def _count_encoding(encoding: Any, depth: int) -> int:
    keys = set(encoding.keys())
    if "attention_mask" in keys:
        return _sum(encoding["attention_mask"], depth + 1)
    if "input_ids" in keys:
        return _count(encoding["input_ids"], depth + 1)
    raise ConfigError(f"a mapping of token ids needs 'input_ids', got keys {sorted(keys)!r}")


def _sum(mask: Any, depth: int) -> int:
    total = getattr(mask, "sum", None)
    if callable(total) and not isinstance(mask, list | tuple):
        return int(total())
    if isinstance(mask, list | tuple):
        return sum(_sum(x, depth + 1) if isinstance(x, list | tuple) else int(x) for x in mask)
    return int(mask)
