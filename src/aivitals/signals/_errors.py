"""The fixed table of error codes every log line and error metric uses.

A log line carries ``error_code`` from this table, never a raw exception text,
so errors can be counted, alerted on and drawn as a heat map by input size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from ._spec import Layer


class ErrorCode(StrEnum):
    CUDA_OOM = "CUDA_OOM"
    CUDA_ERROR = "CUDA_ERROR"
    XID = "XID"
    MODEL_ERROR = "MODEL_ERROR"
    TOKENIZER_ERROR = "TOKENIZER_ERROR"
    INPUT_REJECTED = "INPUT_REJECTED"
    INPUT_TOO_LARGE = "INPUT_TOO_LARGE"
    INPUT_INVALID_UTF8 = "INPUT_INVALID_UTF8"
    INPUT_CONTROL_CHARS = "INPUT_CONTROL_CHARS"
    INPUT_FULLWIDTH = "INPUT_FULLWIDTH"
    INPUT_TOO_MANY_TOKENS = "INPUT_TOO_MANY_TOKENS"
    INPUT_BAD_JSON = "INPUT_BAD_JSON"
    TIMEOUT = "TIMEOUT"
    CLIENT_DISCONNECT = "CLIENT_DISCONNECT"
    QUEUE_FULL = "QUEUE_FULL"
    DEADLINE_UNMEETABLE = "DEADLINE_UNMEETABLE"
    MEMORY_RESERVATION = "MEMORY_RESERVATION"
    DEPENDENCY_DOWN = "DEPENDENCY_DOWN"
    INTERNAL = "INTERNAL"
    UNKNOWN = "UNKNOWN"


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    code: ErrorCode
    layer: Layer
    http_status: int
    meaning: str


ERROR_CODES: dict[ErrorCode, ErrorInfo] = {
    info.code: info
    for info in (
        ErrorInfo(ErrorCode.CUDA_OOM, Layer.MODEL, 503, "CUDA out of memory during inference"),
        ErrorInfo(ErrorCode.CUDA_ERROR, Layer.MODEL, 500, "CUDA runtime error (e.g. error 700)"),
        ErrorInfo(ErrorCode.XID, Layer.MODEL, 500, "the GPU driver reported an Xid error"),
        ErrorInfo(ErrorCode.MODEL_ERROR, Layer.MODEL, 500, "the model call raised"),
        ErrorInfo(
            ErrorCode.TOKENIZER_ERROR,
            Layer.BUSINESS,
            422,
            "the tokenizer failed on the input (UnicodeDecodeError, IndexError)",
        ),
        ErrorInfo(ErrorCode.INPUT_REJECTED, Layer.BUSINESS, 422, "input refused by the guard"),
        ErrorInfo(ErrorCode.INPUT_TOO_LARGE, Layer.BUSINESS, 413, "body over the byte limit"),
        ErrorInfo(ErrorCode.INPUT_INVALID_UTF8, Layer.BUSINESS, 400, "body is not valid UTF-8"),
        ErrorInfo(
            ErrorCode.INPUT_CONTROL_CHARS, Layer.BUSINESS, 422, "control characters in the input"
        ),
        ErrorInfo(
            ErrorCode.INPUT_FULLWIDTH, Layer.BUSINESS, 422, "full-width characters in the input"
        ),
        ErrorInfo(
            ErrorCode.INPUT_TOO_MANY_TOKENS, Layer.BUSINESS, 422, "input over the token limit"
        ),
        ErrorInfo(ErrorCode.INPUT_BAD_JSON, Layer.BUSINESS, 400, "body is not valid JSON"),
        ErrorInfo(ErrorCode.TIMEOUT, Layer.SERVICE, 504, "deadline passed; work aborted"),
        ErrorInfo(
            ErrorCode.CLIENT_DISCONNECT, Layer.SERVICE, 499, "client went away; work aborted"
        ),
        ErrorInfo(ErrorCode.QUEUE_FULL, Layer.SERVICE, 429, "admission queue full"),
        ErrorInfo(
            ErrorCode.DEADLINE_UNMEETABLE,
            Layer.SERVICE,
            429,
            "predicted wait exceeds the request's deadline",
        ),
        ErrorInfo(
            ErrorCode.MEMORY_RESERVATION,
            Layer.MODEL,
            429,
            "GPU memory reservation for the request failed",
        ),
        ErrorInfo(
            ErrorCode.DEPENDENCY_DOWN,
            Layer.INFRASTRUCTURE,
            503,
            "a dependency (Redis, upstream) is unreachable",
        ),
        ErrorInfo(ErrorCode.INTERNAL, Layer.SERVICE, 500, "unhandled exception in the service"),
        ErrorInfo(ErrorCode.UNKNOWN, Layer.SERVICE, 500, "error not in the table"),
    )
}

_CUDA_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED", re.I)
_CUDA_ERR = re.compile(r"CUDA error|cudaError|illegal memory access|device-side assert", re.I)
_XID = re.compile(r"\bXid\b")


def classify_exception(exc: BaseException) -> ErrorCode:
    """Map an exception raised by a model call onto the table.

    Matches on type names and torch's real message texts so it works without
    importing torch (``torch.OutOfMemoryError`` says "CUDA out of memory").
    """
    names = {cls.__name__ for cls in type(exc).__mro__}
    text = f"{type(exc).__name__}: {exc}"
    if "OutOfMemoryError" in names or _CUDA_OOM.search(text):
        return ErrorCode.CUDA_OOM
    if _XID.search(text):
        return ErrorCode.XID
    if _CUDA_ERR.search(text) or "AcceleratorError" in names:
        return ErrorCode.CUDA_ERROR
    if names & {"UnicodeDecodeError", "UnicodeEncodeError"}:
        return ErrorCode.TOKENIZER_ERROR
    if isinstance(exc, TimeoutError):
        return ErrorCode.TIMEOUT
    return ErrorCode.MODEL_ERROR
