"""Sharded checkpoints (FSDP): every rank writes its own shards, nobody gathers.

Under FSDP a full checkpoint means gathering every weight and moment on rank 0 first. A
sharded save instead hands each rank's shards to ``torch.distributed.checkpoint``'s
``async_save``: it stages them in host memory (a copy: training goes on) and writes them on
a background thread, each rank its own files. The layout, under ``OUT/checkpoints/``::

    sharded/step-N/     the shards (*.distcp), DCP's .metadata, and state.pt: rank 0's
                        plain values (step, RNG, scheduler, loss scale, config), saved
                        with torch.save like a full checkpoint minus model and optimizer
    sharded/latest      "step-N": the newest complete one

A save goes to ``sharded/.step-N.tmp/``; once every rank's write finished (DCP's future
completes on all ranks only after rank 0 wrote the metadata, which gathers every rank's
result), rank 0 renames it to ``step-N/`` and replaces ``latest`` (each atomically, the
directory fsynced), then keeps the newest ``--keep-last`` (at least one). A crash leaves
the previous ``step-N/`` and pointer; a failed write is raised at the next save or at the
end as a :class:`~amptrain.checkpoint.files.CheckpointWriteError`, the previous checkpoint
intact. One save in flight, as with :class:`~amptrain.checkpoint.BackgroundWriter`.

Reading: ``state.pt`` with ``weights_only=True``, and the shards with a load planner that
reads DCP's non-tensor entries (the optimizer's param groups) with ``weights_only=True``
too (DCP's default unpickles them). DCP's own ``.metadata`` file is a pickle of its
classes: it is read by :mod:`.dcp_metadata`'s allow-listed unpickler and checked (no code
runs from a planted one), when the checkpoint is found and again when its shards load.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Any

import torch

from ..common.errors import UserError
from ..common.pathkind import write_failure
from .dcp_metadata import UnsafeCheckpointError, read_metadata, safe_reader
from .files import CheckpointWriteError, atomic_save, load

log = logging.getLogger("amptrain")

SHARDED_DIR = "sharded"
LATEST = "latest"
STATE_FILE = "state.pt"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_UNFINISHED_DIR = re.compile(r"^\.step-\d+\.tmp$")


# ------------------------------------------------------------------- finding
def is_sharded(path: str | Path) -> bool:
    """``path`` is a sharded checkpoint directory (``step-N/``)."""
    path = Path(path)
    return path.is_dir() and (path / STATE_FILE).is_file() and (path / ".metadata").is_file()


def latest_sharded(directory: str | Path) -> Path | None:
    """The ``step-N/`` that ``directory/sharded/latest`` names (None when there is none).
    ``directory`` is a run's checkpoint directory."""
    root = Path(directory) / SHARDED_DIR
    try:
        name = (root / LATEST).read_text().strip()
    except OSError:
        return None
    found = root / name
    if not _STEP_DIR.match(name) or not is_sharded(found):
        log.warning("skipping %s: it names %s, which is not a complete sharded checkpoint",
                    root / LATEST, name)
        return None
    return found


def load_state(path: str | Path) -> dict[str, Any]:
    """A sharded checkpoint's plain values (``state.pt``), validated like a full checkpoint;
    its ``model`` and ``optimizer`` sections are empty (they are in the shards)."""
    path = Path(path)
    if not is_sharded(path):
        raise UserError(f"checkpoint {path}: not a sharded checkpoint directory (it needs "
                        f"{STATE_FILE} and .metadata)")
    read_metadata(path)  # checked before anything trusts the directory
    state = load(path / STATE_FILE)
    state["sharded"] = str(path)
    return state


def remove_unfinished(directory: str | Path) -> list[Path]:
    """Delete ``sharded/.step-N.tmp/`` directories of saves that never finished."""
    root = Path(directory) / SHARDED_DIR
    if not root.is_dir():
        return []
    removed = []
    for leftover in root.iterdir():
        if _UNFINISHED_DIR.match(leftover.name) and leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
            removed.append(leftover)
    return removed


# ------------------------------------------------------------------- loading
def _weights_only_planner() -> Any:
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint.planner import ReadItem

    class WeightsOnlyLoadPlanner(DefaultLoadPlanner):
        """DCP's planner, but non-tensor entries are read with ``weights_only=True``."""

        def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
            loaded = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                from torch.distributed.checkpoint._nested_dict import set_element

                set_element(self.original_state_dict,
                            self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return WeightsOnlyLoadPlanner()


def load_into(path: str | Path, model: torch.nn.Module,
              optimizer: torch.optim.Optimizer) -> None:
    """Read a sharded checkpoint's weights and optimizer state into a set-up (sharded)
    model and its optimizer; collective: every rank calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    read_metadata(path)  # a clear error before DCP starts (its reader checks it again)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_state, "optimizer": optimizer_state}
    try:
        dcp.load(state, checkpoint_id=str(path), storage_reader=safe_reader(path),
                 planner=_weights_only_planner())
    except BaseException as exc:  # DCP wraps each rank's failure (CheckpointException)
        if not (isinstance(exc, Exception) or _dcp_failure(exc)):
            raise
        cause = _root_os_error(exc) or exc
        if isinstance(cause, UserError):  # the metadata, replaced since it was checked
            raise cause from None
        text = str(cause).strip().splitlines()
        raise UserError(f"checkpoint {path}: its shards do not load into this model "
                        f"({text[-1] if text else type(cause).__name__})") from None
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])


# ------------------------------------------------------------------- writing
class ShardedWriter:
    """One sharded save in flight (see the module); every rank holds one."""

    def __init__(self) -> None:
        self._future: Any = None
        self._group: Any = None
        self._published: threading.Event | None = None
        self._error: BaseException | None = None
        self._target: Path | None = None
        self._written: Path | None = None  # the last save that completed

    @property
    def busy(self) -> bool:
        return self._future is not None

    def submit(self, directory: str | Path, step: int, state: dict[str, Any],
               model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, is_main: bool,
               keep_last: int) -> Path:
        """Start writing step ``step``'s shards under ``directory/sharded/`` (collective);
        ``state``: the plain values, written by rank 0. Returns the ``step-N/`` it becomes."""
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        self.wait()
        root = Path(directory) / SHARDED_DIR
        tmp, final = root / f".step-{step}.tmp", root / f"step-{step}"
        if self._written == final:  # --save-every and an epoch end at the same step
            return final
        if is_main:
            try:
                tmp.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CheckpointWriteError(_failure(final, exc)) from None
            atomic_save({**state, "model": {}, "optimizer": {}}, tmp / STATE_FILE)
        model_state, optimizer_state = get_state_dict(model, optimizer)
        if self._group is None and dist.is_initialized():
            # The writes' own collectives run on the writer thread while training uses the
            # default group: a group of their own (gloo: DCP's async path needs a CPU one).
            self._group = dist.new_group(backend="gloo")
        response = dcp.async_save({"model": model_state, "optimizer": optimizer_state},
                                  checkpoint_id=str(tmp), process_group=self._group)
        future: Any = getattr(response, "upload_completion", response)
        self._future, self._target, self._error = future, final, None
        self._published = None
        if is_main:
            published = self._published = threading.Event()

            def publish(done: Any) -> None:
                try:
                    done.result()
                    _publish(tmp, final, keep_last)
                except BaseException as exc:  # noqa: BLE001 - raised again by wait()
                    self._error = exc
                finally:
                    published.set()

            future.add_done_callback(publish)
        return final

    def wait(self) -> Path | None:
        """Wait for the save in flight: its ``step-N/``, or its error raised here."""
        future, self._future = self._future, None
        if future is None:
            return None
        target = self._target
        error: BaseException | None = None
        try:
            future.result()
        except BaseException as exc:  # noqa: BLE001
            error = exc
        if self._published is not None:
            self._published.wait()
            error = error or self._error
        if error is None:
            self._written = target
            return target
        if isinstance(error, CheckpointWriteError) \
                or not isinstance(error, Exception) and not _dcp_failure(error):
            raise error  # a second signal ends the process
        assert target is not None
        raise CheckpointWriteError(_failure(target, _root_os_error(error) or error)) from None

    def abandon(self) -> None:
        """Stop waiting for the save in flight (the process exits); its ``.step-N.tmp/``
        is removed by the next ``--resume auto``."""
        self._future = None


def _dcp_failure(exc: BaseException) -> bool:
    """DCP's CheckpointException (a BaseException): some rank's read or write failed."""
    return type(exc).__name__ == "CheckpointException" and hasattr(exc, "failures")


def _root_os_error(exc: BaseException) -> BaseException | None:
    """The OSError behind ``exc`` (inside DCP's per-rank failures too), else the first
    rank's own exception, else None."""
    seen: BaseException | None = exc
    first: BaseException | None = None
    for _ in range(20):
        if seen is None:
            break
        if isinstance(seen, OSError):
            return seen
        if _dcp_failure(seen):
            failures = [f[0] if isinstance(f, tuple) else f
                        for f in getattr(seen, "failures", {}).values()]
            found = next((e for e in failures if isinstance(e, BaseException)), None)
            first = first or found
            seen = found
            continue
        seen = seen.__cause__ or seen.__context__
    return first


def _failure(target: Path, exc: BaseException) -> str:
    if isinstance(exc, OSError):
        reason = write_failure(target, exc).removeprefix(f"cannot write {target}: ")
    else:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
    previous = latest_sharded(target.parent.parent)
    kept = (f"the previous checkpoint {previous} is intact" if previous is not None
            else "no earlier sharded checkpoint was there")
    return (f"could not write checkpoint {target}: {reason}; {kept}. Free disk space or make "
            f"{target.parent} writable, then continue with --resume auto")


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _publish(tmp: Path, final: Path, keep_last: int) -> None:
    """Rank 0, once every rank finished: ``.step-N.tmp/`` becomes ``step-N/``, ``latest``
    names it, and old ones go."""
    root = tmp.parent
    try:
        if final.exists():  # the same step saved again (a run resumed from before it)
            shutil.rmtree(final)
        os.replace(tmp, final)
        pointer = root / f".{LATEST}.tmp"
        with open(pointer, "w") as handle:
            handle.write(f"{final.name}\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(pointer, root / LATEST)
        _fsync_dir(root)
    except OSError as exc:
        raise CheckpointWriteError(_failure(final, exc)) from None
    steps = sorted((int(m.group(1)), p) for p in root.iterdir()
                   if (m := _STEP_DIR.match(p.name)) and p.is_dir())
    for _, old in steps[:max(0, len(steps) - max(1, keep_last))]:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)


def newer_of(full: tuple[Path, dict[str, Any]] | None, directory: str | Path
             ) -> tuple[Path, dict[str, Any]] | None:
    """The newer of a run's full checkpoint (``full``, as found) and its latest sharded one
    under ``directory``; the full one when both hold the same step (it loads anywhere)."""
    path = latest_sharded(directory)
    if path is None:
        return full
    try:
        sharded = (path, load_state(path))
    except UnsafeCheckpointError:
        raise  # a planted file is the user's to look at, not to skip
    except UserError as exc:
        log.warning("skipping %s", exc)
        return full
    if full is None or int(sharded[1]["step"]) > int(full[1]["step"]):
        return sharded
    return full


__all__ = ["LATEST", "SHARDED_DIR", "STATE_FILE", "ShardedWriter", "is_sharded",
           "latest_sharded", "load_into", "load_state", "newer_of", "remove_unfinished"]
