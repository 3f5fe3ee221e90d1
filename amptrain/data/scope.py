"""Which ``--data`` an option section applies to.

A data source (or a task that trains on one) declares, beside its options, the spec
prefixes they apply to (:class:`DataScope`, the section's ``SCOPE``); the run's config
asks each section's scope to refuse an option set for other data, naming both flags
(``--seq-len applies to text: data (language modelling); --data is digits``), so no list
of prefixes is kept anywhere else. Torch-free: the command line's parser is built from
the sections.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from ..common.errors import UserError, flag
from ..common.options import flat_name


@dataclass(frozen=True)
class DataScope:
    """The ``--data`` specs a section's options apply to."""

    #: What the options are for, as a refusal words it ("text: data (language modelling)").
    applies_to: str
    #: The spec prefixes (``"text:"``) where every option of the section applies.
    prefixes: tuple[str, ...]
    #: Specs where only some of the options apply, the rest having been decided before:
    #: prefix -> (the options that still apply there, why the others are refused there).
    decided: dict[str, tuple[tuple[str, ...], str]] = field(default_factory=dict)

    def check(self, section: Any, data: str) -> None:
        """Refuse the first option of ``section`` set away from its default for ``data``
        (the ``--data`` spec) when it does not apply there, naming both flags."""
        set_ = [flat_name(f) for f in dataclasses.fields(section)
                if getattr(section, f.name) != f.default]
        if not set_:
            return
        for prefix, (still, why) in self.decided.items():
            if data.startswith(prefix):
                refused = [name for name in set_ if name not in still]
                if refused:
                    raise UserError(f"{flag(refused[0])} {why}; {flag('data')} is {data}")
                return
        if not data.startswith(self.prefixes):
            raise UserError(f"{flag(set_[0])} applies to {self.applies_to}; "
                            f"{flag('data')} is {data}")


class Scoped(Protocol):
    """An option section that applies to some data only (it declares its :class:`DataScope`)."""

    SCOPE: ClassVar[DataScope]
