"""A sharded checkpoint's ``.metadata``, read without running code from it, and checked.

``torch.distributed.checkpoint`` (DCP) writes its ``.metadata`` as a pickle of its own
classes and reads it back with ``pickle.load``, which imports and calls whatever the file
names: a planted ``step-N/.metadata`` would run its code on ``--resume``. Here it is read
by an unpickler that knows only the classes DCP's metadata holds (its dataclasses,
``torch.Size``, dtypes and layouts, paths); anything else is refused before it is called.

What it says is then checked before DCP follows it: every storage entry names a regular
file inside the checkpoint directory (no ``../``), with an offset and length inside that
file, and no stream transform (amptrain writes none; a decompressor would be a bomb).
:class:`SafeFileSystemReader` hands DCP the checked metadata.
"""
from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch

from ..common.errors import UserError
from ..common.pathkind import not_regular_reason

METADATA_FILE = ".metadata"
#: A .metadata larger than this is not one amptrain wrote (a few kB per parameter).
MAX_METADATA_BYTES = 256 * 1024 * 1024

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
_DCP_FILESYSTEM = "torch.distributed.checkpoint.filesystem"
#: (module, name) pairs a DCP ``.metadata`` legitimately holds (found by unpickling the
#: metadata of amptrain's own sharded saves, AdamW and SGD states, fp32 and bf16 weights).
#: Each is a plain data class or a constructor without side effects.
_ALLOWED: frozenset[tuple[str, str]] = frozenset({
    *((_DCP_METADATA, name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
        "TensorStorageMetadata", "ChunkStorageMetadata", "BytesStorageMetadata",
        "_MEM_FORMAT_ENCODING")),
    (_DCP_FILESYSTEM, "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    # storage_meta.checkpoint_id: a path (pathlib became a package in Python 3.13)
    *((module, name) for module in ("pathlib", "pathlib._local")
      for name in ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")),
})


class UnsafeCheckpointError(UserError):
    """A checkpoint file names code to run: refused, never skipped silently."""


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only :data:`_ALLOWED` names and torch's dtypes and layouts (values, not
    callables); everything else raises before anything is imported or called."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch":
            value = getattr(torch, name, None)
            if isinstance(value, (torch.dtype, torch.layout)):
                return value
        raise _Refused(f"{module}.{name}")


class _Refused(pickle.UnpicklingError):
    pass


def read_metadata(directory: str | Path) -> Any:
    """``directory/.metadata`` as DCP's ``Metadata``, read safely and checked; a
    :class:`UserError` naming the file otherwise (:class:`UnsafeCheckpointError` for one
    that names code)."""
    from torch.distributed.checkpoint.metadata import Metadata

    directory = Path(directory)
    path = directory / METADATA_FILE
    special = not_regular_reason(path)
    if special:
        raise UserError(f"checkpoint {special}")
    try:
        size = path.stat().st_size
        if size > MAX_METADATA_BYTES:
            raise UserError(f"checkpoint {path}: {size} bytes, far more than the metadata of "
                            f"a sharded checkpoint (a damaged file)")
        with open(path, "rb") as handle:
            metadata = _MetadataUnpickler(handle).load()
    except _Refused as exc:
        raise UnsafeCheckpointError(
            f"checkpoint {path}: refers to {exc}, which a sharded checkpoint's metadata never "
            f"holds (a damaged or planted file); amptrain does not load it. Remove "
            f"{directory} or resume from another checkpoint") from None
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - any malformed pickle: EOF, bad opcode, ...
        raise UserError(f"checkpoint {path}: unreadable sharded-checkpoint metadata "
                        f"({type(exc).__name__}; a damaged or truncated file)") from None
    if not isinstance(metadata, Metadata):
        raise UserError(f"checkpoint {path}: holds a {type(metadata).__name__}, not a sharded "
                        f"checkpoint's metadata (a damaged file)")
    _check_storage(metadata, directory, path)
    return metadata


def _check_storage(metadata: Any, directory: Path, path: Path) -> None:
    """Every storage entry: a regular file inside ``directory``, a range inside it, no
    transform; the entries of the state dict of DCP's own types."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        MetadataIndex,
        TensorStorageMetadata,
    )

    def damaged(what: str) -> UserError:
        return UserError(f"checkpoint {path}: {what} (a damaged or hand-edited file)")

    entries = getattr(metadata, "state_dict_metadata", None)
    if not isinstance(entries, dict) or not all(
            isinstance(k, str) and isinstance(v, (TensorStorageMetadata, BytesStorageMetadata))
            for k, v in entries.items()):
        raise damaged("its state-dict entries are not DCP's tensor and bytes records")
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(storage, dict):
        raise damaged("it has no storage table")
    root = os.path.realpath(directory)
    sizes: dict[str, int] = {}
    for index, info in storage.items():
        if not isinstance(index, MetadataIndex) or not isinstance(info, _StorageInfo):
            raise damaged("its storage table holds something other than DCP's records")
        name = info.relative_path
        if not isinstance(name, str) or not name or os.path.isabs(name) or "\0" in name:
            # (a NUL byte: no file name holds one, and realpath raises a ValueError on it)
            raise damaged(f"a storage entry names {name!r}, not a file of the checkpoint")
        file = os.path.realpath(os.path.join(root, name))
        if os.path.commonpath([root, file]) != root or file == root:
            raise damaged(f"a storage entry names {name!r}, outside {directory}")
        if name not in sizes:
            special = not_regular_reason(file)
            if special:
                raise damaged(f"its shard {special}")
            if not os.path.isfile(file):
                raise damaged(f"its shard {name} is missing")
            sizes[name] = os.path.getsize(file)
        offset, length = info.offset, info.length
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                   for v in (offset, length)) or offset + length > sizes[name]:
            raise damaged(f"a storage entry of {name} lies outside the file")
        if info.transform_descriptors:
            raise damaged(f"a storage entry of {name} asks for a stream transform, which "
                          f"amptrain never writes")


def safe_reader(directory: str | Path) -> Any:
    """DCP's ``FileSystemReader`` for ``directory``, whose metadata is :func:`read_metadata`."""
    from torch.distributed.checkpoint import FileSystemReader

    class SafeFileSystemReader(FileSystemReader):
        """Reads ``.metadata`` with :func:`read_metadata` (no code runs from it)."""

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            from torch.distributed.checkpoint.metadata import StorageMeta

            if kwargs.get("rank") is not None:  # rank-local metadata: amptrain writes none
                raise UserError(f"checkpoint {directory}: rank-local metadata is not read")
            metadata = read_metadata(directory)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeFileSystemReader(str(directory))


__all__ = ["METADATA_FILE", "UnsafeCheckpointError", "read_metadata", "safe_reader"]
