"""What an out-of-memory error looks like, in one place: the step's redo in smaller
micro-batches (trainer/autobatch.py) retries it, and nothing else may turn it into
another error (the first batch's check of the data, common/forward.py)."""
from __future__ import annotations

import torch

#: Error texts that mean "out of memory" without being torch.OutOfMemoryError / MemoryError:
#: the CPU allocator, and cuBLAS/cuDNN failing to get a workspace.
_OOM_TEXTS = ("out of memory", "can't allocate memory", "cublas_status_alloc_failed",
              "cudnn_status_alloc_failed")


def is_out_of_memory(exc: BaseException) -> bool:
    """True for CUDA's OutOfMemoryError, MemoryError, and allocator failures (CPU, cuBLAS)."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(t in text for t in _OOM_TEXTS)


__all__ = ["is_out_of_memory"]
