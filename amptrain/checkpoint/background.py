"""Checkpoint writes off the training thread: the state is copied, then written later.

A background save hands a state to a thread that writes it with the same atomic rename
as a synchronous save. At most one write is in flight: the next save waits for the
previous one, and so does the end of a run. A write that failed raises its error (a
:class:`~amptrain.checkpoint.files.CheckpointWriteError` naming the file) there: at the
next save or at the end; its temporary file is gone, the previous checkpoint is intact.

The copy. Tensors go into host buffers kept from one save to the next (pinned memory for
CUDA tensors). Most of a checkpoint -- the weights and the optimizer's moments -- changes
only when an optimizer steps, so those tensors (an optimizer's parameters and state,
``defer=``) are copied by the writer thread itself, while training runs the next forward
and backward; each such optimizer's next ``step()`` waits for that copy first (a pre-step
hook put in front of every other one: a rule such as Kahan's decoupled weight decay
writes the parameters in a pre-step hook of its own). Everything else is copied at once on
the caller's thread, because the next forward may change it: module buffers (BatchNorm's
running statistics and counters), the RNG states, the loss scaler's and the metrics'
tensors. An optimizer step that is skipped (a non-finite fp16 gradient) never calls
``step()`` and changes nothing, so nothing needs to wait for it.

The cost is one host copy of the state, held for the whole run (the buffers are reused).
"""
from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from ..common import nested
from .files import remove_unfinished
from .sharded import ShardedWriter

log = logging.getLogger("amptrain")

#: Where in a state a tensor sits (its keys and indices from the top).
_Where = tuple[Any, ...]
#: Tensors copied through a host buffer; subclasses (quantised states, DTensor) are copied
#: plainly.
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _storage(value: torch.Tensor) -> int | None:
    """The address of a plain tensor's storage (None for tensors without one)."""
    if type(value) not in _PLAIN or value.layout != torch.strided:
        return None
    try:
        address = value.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    return address or None


def optimizer_storages(optimizers: Iterable[torch.optim.Optimizer]) -> set[int]:
    """Storages only ``step()`` of these optimizers changes: parameters and state tensors
    (the plain parts of a quantised state included)."""
    found: set[int] = set()

    def add(value: Any) -> None:
        if not isinstance(value, torch.Tensor):
            return
        if type(value) not in _PLAIN and hasattr(value, "__tensor_flatten__"):
            for name in value.__tensor_flatten__()[0]:
                add(getattr(value, name))
            return
        address = _storage(value)
        if address is not None:
            found.add(address)

    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for param in group["params"]:
                add(param)
        for state in optimizer.state.values():
            for value in state.values():
                add(value)
    return found


class _Staging:
    """Host copies of a state's tensors, in buffers reused by the next save of the same
    shapes (no allocation and no page faults after the first save)."""

    def __init__(self) -> None:
        self._buffers: dict[_Where, torch.Tensor] = {}

    def copy(self, state: Any, deferred: set[int] = frozenset()  # type: ignore[assignment]
             ) -> tuple[Any, torch.cuda.Event | None, list[tuple[torch.Tensor, torch.Tensor]]]:
        """A copy of ``state`` that training can no longer change; the CUDA event that marks
        its device-to-host copies done (None when nothing came from a GPU); and the copies
        left to do, (buffer, source) pairs for the tensors whose storage is in ``deferred``
        (their buffers are already in the returned state)."""
        used: dict[_Where, torch.Tensor] = {}
        # Tensors that share memory (tied weights) are copied once and stay shared.
        copies: dict[tuple[Any, ...], torch.Tensor] = {}
        pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        from_cuda = False

        def tensor(where: _Where, value: torch.Tensor) -> torch.Tensor:
            nonlocal from_cuda
            if type(value) not in _PLAIN or value.layout != torch.strided \
                    or value.device.type not in ("cpu", "cuda"):
                return value.detach().to("cpu", copy=True)  # rare kinds: a plain copy
            address = value.untyped_storage().data_ptr()
            key = (address, value.storage_offset(), tuple(value.shape), value.stride(),
                   value.dtype)
            if key in copies:
                return copies[key]
            cuda = value.device.type == "cuda"
            buffer = self._buffers.get(where)
            if buffer is None or buffer.shape != value.shape or buffer.dtype != value.dtype \
                    or buffer.stride() != value.stride() or buffer.is_pinned() != cuda:
                buffer = torch.empty_like(value, device="cpu", pin_memory=cuda)
            if address and address in deferred:
                pending.append((buffer, value.detach()))
            else:
                buffer.copy_(value.detach(), non_blocking=cuda)
                from_cuda = from_cuda or cuda
            used[where] = copies[key] = buffer
            return buffer

        # Numbers, strings, dtypes pass through: immutable.
        copied = nested.map_tensors_with_path(tensor, state)
        self._buffers = used
        ready = None
        if from_cuda:
            ready = torch.cuda.Event()
            ready.record()
        return copied, ready, pending


def _copy_deferred(pending: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """The writer thread's copies (the seam tests hold back to catch a step racing them)."""
    devices = set()
    with torch.no_grad():
        for buffer, source in pending:
            on_cuda = source.device.type == "cuda"
            buffer.copy_(source, non_blocking=on_cuda)
            if on_cuda:
                devices.add(source.device)
    for device in devices:  # the copies ran on the device's current stream, after the step
        torch.cuda.current_stream(device).synchronize()


class _Write:
    """One write on its thread: the copied state, what to call, and how it ended."""

    def __init__(self, state: Any, ready: torch.cuda.Event | None,
                 pending: list[tuple[torch.Tensor, torch.Tensor]],
                 write: Callable[[Any], Path], directory: Path) -> None:
        self.state, self.ready, self.write, self.directory = state, ready, write, directory
        self.pending = pending
        self.result: Path | None = None
        self.error: BaseException | None = None
        # Set once the deferred tensors are copied (or the copy failed): the optimizers
        # may step again.
        self.copied = threading.Event()
        # Not Thread.is_alive(): a signal that interrupts Thread.join() on Python 3.11 can
        # leave a running thread marked as stopped.
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, name="amptrain-checkpoint",
                                       daemon=True)

    def run(self) -> None:
        try:
            try:
                _copy_deferred(self.pending)
            finally:
                self.pending = []
                self.copied.set()
            if self.ready is not None:
                self.ready.synchronize()
            self.result = self.write(self.state)
        except BaseException as exc:  # noqa: BLE001 - raised again by BackgroundWriter.wait
            self.error = exc
        finally:
            self.state = None
            self.copied.set()
            self.done.set()


class BackgroundWriter:
    """At most one checkpoint write in flight, on a thread of its own (see the module)."""

    def __init__(self) -> None:
        self._staging = _Staging()
        self._write: _Write | None = None
        self._sharded: Any = None  # a ShardedWriter, from the first sharded save on
        # The optimizers whose step waits for the copy: id -> (the optimizer, its hook).
        self._hooked: dict[int, tuple[weakref.ref, Any]] = {}

    @property
    def busy(self) -> bool:
        """A write was submitted and nobody has waited for it yet."""
        return self._write is not None or (self._sharded is not None and self._sharded.busy)

    def submit_sharded(self, directory: str | Path, step: int, state: dict[str, Any],
                       model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                       is_main: bool, keep_last: int) -> Path:
        """A sharded save (FSDP, :mod:`.sharded`) of ``model`` and ``optimizer`` with the
        plain values ``state``; collective. Waits for any write in flight first."""

        self.wait()
        if self._sharded is None:
            self._sharded = ShardedWriter()
        return self._sharded.submit(directory, step, state, model, optimizer,
                                    is_main=is_main, keep_last=keep_last)

    def submit(self, state: dict[str, Any], write: Callable[[Any], Path],
               directory: str | Path,
               defer: Iterable[torch.optim.Optimizer] = ()) -> None:
        """Copy ``state`` and call ``write(copy)`` on a background thread.

        Waits for the write before first (raising its error, if it failed). ``directory``
        is where ``write`` puts its temporary files (cleaned by :meth:`abandon`).
        ``defer``: optimizers whose parameters and state the writer thread copies; their
        next ``step()`` waits for that copy (see the module).
        """
        self.wait()
        optimizers = list(defer)
        deferred = optimizer_storages(optimizers) if optimizers else set()
        copied, ready, pending = self._staging.copy(state, deferred)
        if pending:
            for optimizer in optimizers:
                self._hook(optimizer)
        self._write = _Write(copied, ready, pending, write, Path(directory))
        self._write.thread.start()

    def wait_for_copy(self) -> None:
        """Return once no tensor of the write in flight is still to be copied."""
        job = self._write
        if job is not None and not job.copied.is_set():
            job.copied.wait()

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.wait_for_copy()

    def _hook(self, optimizer: torch.optim.Optimizer) -> None:
        """Make ``optimizer.step()`` wait for the copy, before any other pre-step hook runs
        (also those registered since the last save)."""
        entry = self._hooked.get(id(optimizer))
        if entry is None or entry[0]() is not optimizer:
            handle = optimizer.register_step_pre_hook(self._before_step)
            entry = self._hooked[id(optimizer)] = (weakref.ref(optimizer), handle)
        hooks = getattr(optimizer, "_optimizer_step_pre_hooks", None)
        if hooks is not None and entry[1].id in hooks:
            hooks.move_to_end(entry[1].id, last=False)

    def close(self) -> None:
        """Remove the optimizers' hooks (after the last :meth:`wait`)."""
        for _, handle in self._hooked.values():
            handle.remove()
        self._hooked = {}

    def wait(self) -> Path | None:
        """Wait for the write in flight: its result, or its error raised here.

        A signal that raises while waiting (a second Ctrl-C or SIGTERM) abandons the
        write (:meth:`abandon`): the process is about to exit.
        """
        result = None
        if self._sharded is not None and self._sharded.busy:
            try:
                result = self._sharded.wait()
            except BaseException as exc:
                if not isinstance(exc, Exception):
                    self.abandon()
                raise
        job = self._write
        if job is None:
            return result
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
        if self._sharded is not None:
            self._sharded.abandon()
        job, self._write = self._write, None
        if job is not None and not job.done.is_set():
            removed = remove_unfinished(job.directory)
            if removed:
                log.info("abandoned the checkpoint write in flight (removed %s)",
                         ", ".join(map(str, removed)))
