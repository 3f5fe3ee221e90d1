"""What the audit found: one :class:`Finding` per trap, collected in an :class:`AuditReport`.

A finding names the user's own code: :func:`user_location` walks the stack at the call the
observer saw and keeps the innermost frame that is neither torch's nor amptrain's.
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SEVERITIES = ("error", "warning", "info")

#: Folders whose frames are never "the user's": the observer itself, torch and the stdlib.
_SKIPPED = tuple(str(Path(p).resolve()) for p in (
    Path(__file__).resolve().parent,                      # amptrain/audit
    Path(json.__file__).resolve().parents[1],             # the standard library
))


def _is_library(filename: str) -> bool:
    if filename.startswith("<"):
        return True
    resolved = os.path.realpath(filename)
    return (resolved.startswith(_SKIPPED) or f"{os.sep}torch{os.sep}" in resolved
            or f"{os.sep}site-packages{os.sep}" in resolved
            or f"{os.sep}dist-packages{os.sep}" in resolved)


def user_location() -> str:
    """``file:line`` of the innermost frame on the stack that is the user's code, or ''."""
    for frame in reversed(traceback.extract_stack(sys._getframe(1))):
        if not _is_library(frame.filename):
            return f"{frame.filename}:{frame.lineno}"
    return ""


@dataclass
class Finding:
    """One trap: ``kind`` (a fixed name), ``severity`` (error|warning|info), ``where`` (a
    parameter or module name and the user's file:line when known), ``detail`` (with the
    measured numbers) and ``fix`` (one line)."""

    kind: str
    severity: str
    where: str
    detail: str
    fix: str

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES} (got {self.severity!r})")

    def line(self) -> str:
        """The finding as printed: ``severity kind at where: detail`` and the fix below."""
        where = f" at {self.where}" if self.where else ""
        return f"{self.severity}: {self.kind}{where}\n  {self.detail}\n  fix: {self.fix}"


@dataclass
class AuditReport:
    """The findings of one audit, in the order they were first seen, one per (kind, where)."""

    findings: list[Finding] = field(default_factory=list)
    #: Optimizer steps observed (all optimizers together).
    steps: int = 0

    def add(self, finding: Finding) -> None:
        """Keep ``finding`` unless the same kind was already found at the same place."""
        if not any(f.kind == finding.kind and f.where == finding.where for f in self.findings):
            self.findings.append(finding)

    def extend(self, findings: Iterable[Finding]) -> None:
        """:meth:`add` each of ``findings``."""
        for finding in findings:
            self.add(finding)

    def kinds(self) -> list[str]:
        """The kinds found, each once, in order."""
        return list(dict.fromkeys(f.kind for f in self.findings))

    @property
    def has_errors(self) -> bool:
        """Whether any finding is an error (the command then exits 1)."""
        return any(f.severity == "error" for f in self.findings)

    def __iter__(self) -> Iterator[Finding]:
        return iter(self.findings)

    def __len__(self) -> int:
        return len(self.findings)

    def to_json(self) -> dict[str, Any]:
        """``{"findings": [...], "steps": N}``."""
        return {"findings": [asdict(f) for f in self.findings], "steps": self.steps}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AuditReport:
        """The report :meth:`to_json` wrote."""
        report = cls(steps=int(data.get("steps", 0)))
        report.extend(Finding(**{k: str(item[k]) for k in
                                 ("kind", "severity", "where", "detail", "fix")})
                      for item in data.get("findings", []))
        return report

    def format(self, observed: str = "optimizer steps observed") -> str:
        """The findings as printed by ``amptrain audit``, errors first; ``observed`` names
        what :attr:`steps` counts."""
        if not self.findings:
            return f"no findings ({self.steps} {observed})"
        order = sorted(self.findings, key=lambda f: SEVERITIES.index(f.severity))
        counts = {s: sum(f.severity == s for f in self.findings) for s in SEVERITIES}
        head = ", ".join(f"{n} {s}{'s' if n != 1 else ''}" for s, n in counts.items() if n)
        return "\n".join([f"{head} ({self.steps} {observed})"]
                         + [f.line() for f in order])
