"""The precision's checkpoint section: its layout version and the one migration.

Today's layout (:data:`FORMAT_VERSION` 1), as :meth:`Precision.state_dict` writes it::

    {"name": mode, "scaler": {...}, "loss_scalers": {"0": {...}, ...} (separate scales),
     "skipped_steps": n, "consecutive_skips": n,     # all pairs together
     "pairs": [{"skipped_steps": n, "consecutive_skips": n, "weight_update": {...} | None},
               ...]}                                 # in registration order

Version 0 is every file written before sections were versioned. It came in two shapes:
one model/optimizer pair counted at the top level with no ``pairs`` (before issue 25), and
``pairs`` whose first entry left its weight-rule state to a top-level ``weight_update``.
:func:`migrate_state` turns both into today's layout, so loading reads one layout only.
"""
from __future__ import annotations

from typing import Any

from ..common.errors import UserError

#: The checkpoint key the precision's state is stored under.
SECTION = "precision"
#: The layout :meth:`Precision.state_dict` writes (see the module docstring).
FORMAT_VERSION = 1


def migrate_state(state: dict[str, Any], version: int) -> dict[str, Any]:
    """``state``, a precision section written at layout ``version``, in today's layout."""
    if isinstance(version, bool) or not isinstance(version, int) \
            or not 0 <= version <= FORMAT_VERSION:
        raise UserError(f"the checkpoint's {SECTION} section has layout version {version!r}; "
                        f"this amptrain reads versions 0 to {FORMAT_VERSION} (a newer amptrain "
                        f"wrote it, or the file was edited)")
    if version == FORMAT_VERSION or not isinstance(state, dict):
        return state  # a non-dict is named by load_state_dict's check
    migrated = {key: value for key, value in state.items() if key != "weight_update"}
    pairs = state.get("pairs")
    if pairs is None:  # one pair, counted at the top level
        pairs = [{"skipped_steps": state.get("skipped_steps", 0),
                  "consecutive_skips": state.get("consecutive_skips", 0)}]
    pairs = [dict(pair) if isinstance(pair, dict) else pair for pair in pairs] \
        if isinstance(pairs, list) else pairs
    if isinstance(pairs, list) and pairs and isinstance(pairs[0], dict):
        pairs[0]["weight_update"] = state.get("weight_update")
    migrated["pairs"] = pairs
    return migrated
