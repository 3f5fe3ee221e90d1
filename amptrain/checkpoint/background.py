"""Checkpoint writes off the training thread: the state is copied now, written later.

A background save copies the state first, on the caller's thread -- tensors into host
buffers kept from one save to the next (pinned memory for CUDA tensors, so the copy runs
on the stream without stopping the host; a plain copy on the CPU, where training goes on
changing the weights in place) -- and hands the copy to a thread that writes it with the
same atomic rename as a synchronous save. At most one write is in flight: the next save
waits for the previous one, and so does the end of a run. A write that failed raises its
error (a :class:`~amptrain.checkpoint.files.CheckpointWriteError` naming the file) there:
at the next save or at the end; its temporary file is gone, the previous checkpoint is
intact.

The cost is one host copy of the state, held for the whole run (the buffers are reused).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .files import remove_unfinished

log = logging.getLogger("amptrain")

#: Where in a state a tensor sits (its keys and indices from the top).
_Where = tuple[Any, ...]


class _Staging:
    """Host copies of a state's tensors, in buffers reused by the next save of the same
    shapes (no allocation and no page faults after the first save)."""

    def __init__(self) -> None:
        self._buffers: dict[_Where, torch.Tensor] = {}

    def copy(self, state: Any) -> tuple[Any, torch.cuda.Event | None]:
        """A copy of ``state`` that training can no longer change, and the CUDA event that
        marks its device-to-host copies done (None when nothing came from a GPU)."""
        used: dict[_Where, torch.Tensor] = {}
        # Tensors that share memory (tied weights) are copied once and stay shared.
        copies: dict[tuple[Any, ...], torch.Tensor] = {}
        from_cuda = False

        def tensor(where: _Where, value: torch.Tensor) -> torch.Tensor:
            nonlocal from_cuda
            if type(value) is not torch.Tensor or value.layout != torch.strided \
                    or value.device.type not in ("cpu", "cuda"):
                return value.detach().to("cpu", copy=True)  # rare kinds: a plain copy
            key = (value.untyped_storage().data_ptr(), value.storage_offset(),
                   tuple(value.shape), value.stride(), value.dtype)
            if key in copies:
                return copies[key]
            cuda = value.device.type == "cuda"
            buffer = self._buffers.get(where)
            if buffer is None or buffer.shape != value.shape or buffer.dtype != value.dtype \
                    or buffer.stride() != value.stride() or buffer.is_pinned() != cuda:
                buffer = torch.empty_like(value, device="cpu", pin_memory=cuda)
            buffer.copy_(value.detach(), non_blocking=cuda)
            from_cuda = from_cuda or cuda
            used[where] = copies[key] = buffer
            return buffer

        def walk(where: _Where, value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return tensor(where, value)
            if isinstance(value, dict):  # dict and OrderedDict (weights_only loads both)
                return type(value)((k, walk((*where, k), v)) for k, v in value.items())
            if isinstance(value, list):
                return [walk((*where, i), v) for i, v in enumerate(value)]
            if type(value) is tuple:
                return tuple(walk((*where, i), v) for i, v in enumerate(value))
            return value  # numbers, strings, torch.Size, dtypes: immutable

        copied = walk((), state)
        self._buffers = used
        ready = None
        if from_cuda:
            ready = torch.cuda.Event()
            ready.record()
        return copied, ready


class _Write:
    """One write on its thread: the copied state, what to call, and how it ended."""

    def __init__(self, state: Any, ready: torch.cuda.Event | None,
                 write: Callable[[Any], Path], directory: Path) -> None:
        self.state, self.ready, self.write, self.directory = state, ready, write, directory
        self.result: Path | None = None
        self.error: BaseException | None = None
        # Not Thread.is_alive(): a signal that interrupts Thread.join() on Python 3.11 can
        # leave a running thread marked as stopped.
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, name="amptrain-checkpoint",
                                       daemon=True)

    def run(self) -> None:
        try:
            if self.ready is not None:
                self.ready.synchronize()
            self.result = self.write(self.state)
        except BaseException as exc:  # noqa: BLE001 - raised again by BackgroundWriter.wait
            self.error = exc
        finally:
            self.state = None
            self.done.set()


class BackgroundWriter:
    """At most one checkpoint write in flight, on a thread of its own (see the module)."""

    def __init__(self) -> None:
        self._staging = _Staging()
        self._write: _Write | None = None

    @property
    def busy(self) -> bool:
        """A write was submitted and nobody has waited for it yet."""
        return self._write is not None

    def submit(self, state: dict[str, Any], write: Callable[[Any], Path],
               directory: str | Path) -> None:
        """Copy ``state`` and call ``write(copy)`` on a background thread.

        Waits for the write before first (raising its error, if it failed). ``directory``
        is where ``write`` puts its temporary files (cleaned by :meth:`abandon`).
        """
        self.wait()
        copied, ready = self._staging.copy(state)
        self._write = _Write(copied, ready, write, Path(directory))
        self._write.thread.start()

    def wait(self) -> Path | None:
        """Wait for the write in flight: its result, or its error raised here.

        A signal that raises while waiting (a second Ctrl-C or SIGTERM) abandons the
        write (:meth:`abandon`): the process is about to exit.
        """
        job = self._write
        if job is None:
            return None
        try:
            job.done.wait()
        except BaseException:
            self.abandon()
            raise
        self._write = None
        if job.error is not None:
            raise job.error
        return job.result

    def abandon(self) -> None:
        """Stop caring about the write in flight and delete its temporary files, for a
        process that exits without waiting (the previous checkpoint stays)."""
        job, self._write = self._write, None
        if job is not None and not job.done.is_set():
            removed = remove_unfinished(job.directory)
            if removed:
                log.info("abandoned the checkpoint write in flight (removed %s)",
                         ", ".join(map(str, removed)))
