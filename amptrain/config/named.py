"""``--optimizer NAME`` and ``--scheduler NAME`` beyond amptrain's own: any
``torch.optim`` optimizer and ``torch.optim.lr_scheduler`` schedule by its class name
(case as torch spells it, or any case), with keyword arguments given as a JSON object
(``--optimizer-args '{"rho": 0.9}'``; a Python dict literal is read too, never executed).
Each is checked in one line: an unknown name gets the nearest names, an unknown keyword
is named with the ones the class takes (as LightningCLI's ``--optimizer Adadelta
--optimizer.rho 0.9`` does; issue 49).
"""
from __future__ import annotations

import ast
import difflib
import inspect
import json
from typing import Any

import torch

from ..common.errors import UserError, flag

#: Optimizers that need a closure in step() (the training step cannot give one).
_CLOSURE = {"LBFGS"}
#: Schedules that step on a metric, which the loop does not hand them.
_METRIC = {"ReduceLROnPlateau"}
#: Schedules built from other schedules (not expressible as one name and keywords).
_COMPOSITE = {"ChainedScheduler", "SequentialLR", "LRScheduler"}


def _classes(module: Any, base: type, skip: set[str]) -> dict[str, type]:
    return {name: cls for name, cls in vars(module).items()
            if isinstance(cls, type) and issubclass(cls, base) and cls is not base
            and not name.startswith("_") and name not in skip}


def optimizer_classes() -> dict[str, type]:
    """torch.optim's optimizers by class name."""
    return _classes(torch.optim, torch.optim.Optimizer, _CLOSURE)


def scheduler_classes() -> dict[str, type]:
    """torch.optim.lr_scheduler's schedules by class name."""
    return _classes(torch.optim.lr_scheduler, torch.optim.lr_scheduler.LRScheduler,
                    _COMPOSITE) | {n: c for n, c in vars(torch.optim.lr_scheduler).items()
                                   if n in _METRIC and isinstance(c, type)}


def lookup(name: str, classes: dict[str, type], option: str, own: tuple[str, ...]) -> type:
    """The class named ``name`` (any case), or a UserError naming ``option`` with the
    nearest names."""
    by_lower = {n.lower(): c for n, c in classes.items()}
    found = classes.get(name) or by_lower.get(name.lower())
    if found is not None:
        if found.__name__ in _METRIC:
            raise UserError(f"{flag(option)} {name} steps on a metric, which the training "
                            f"loop does not hand it; pick a schedule of steps or epochs")
        return found
    names = [*own, *sorted(classes)]
    near = difflib.get_close_matches(name, names, n=3, cutoff=0.6) or \
        difflib.get_close_matches(name.lower(), [n.lower() for n in names], n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(near)}? " if near else ""
    raise UserError(f"{flag(option)} {name} is not one of amptrain's ({', '.join(own)}) nor a "
                    f"{'torch.optim' if option == 'optimizer' else 'torch.optim.lr_scheduler'}"
                    f" class: {hint}(names as torch spells them, e.g. "
                    f"{'Adadelta' if option == 'optimizer' else 'StepLR'})")


def parse_args(text: Any, option: str) -> dict[str, Any]:
    """``--optimizer-args`` / ``--scheduler-args``: a JSON object (or a Python dict
    literal, read with ast.literal_eval), or a mapping from a YAML --config."""
    if text is None or text == "":
        return {}
    if isinstance(text, dict):
        value: Any = text
    else:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            try:
                value = ast.literal_eval(text)  # literals only: nothing is executed
            except (ValueError, SyntaxError):
                raise UserError(f"{flag(option)} must be a JSON object of keyword arguments, "
                                f"e.g. '{{\"rho\": 0.9}}' (got {text!r})") from None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise UserError(f"{flag(option)} must be a JSON object of keyword arguments "
                        f"(got {text!r})")
    return value


def check_keywords(cls: type, kwargs: dict[str, Any], option: str,
                   reserved: tuple[str, ...]) -> None:
    """Refuse a keyword ``cls`` does not take, or one amptrain sets itself, naming it."""
    parameters = inspect.signature(cls).parameters
    takes = [p for p in parameters if p not in ("self", *reserved)
             and parameters[p].kind not in (inspect.Parameter.VAR_POSITIONAL,
                                            inspect.Parameter.VAR_KEYWORD)]
    for key in kwargs:
        if key in reserved:
            raise UserError(f"{flag(option)}: {key!r} is set by amptrain (the model's "
                            f"parameters, {flag('lr')}); leave it out")
        if key not in takes:
            near = difflib.get_close_matches(key, takes, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise UserError(f"{flag(option)}: {cls.__name__} takes no argument {key!r}; "
                            f"{hint}it takes {', '.join(takes) or 'none'}")


def default_lr(name: str) -> float:
    """A torch optimizer's own default learning rate (Adadelta's 1.0), for ``--lr`` unset."""
    cls = lookup(name, optimizer_classes(), "optimizer", ())
    lr = inspect.signature(cls).parameters.get("lr")
    value = lr.default if lr is not None else inspect.Parameter.empty
    if isinstance(value, torch.Tensor):
        value = float(value)
    if not isinstance(value, (int, float)):
        raise UserError(f"{flag('optimizer')} {cls.__name__} has no default learning rate: "
                        f"give {flag('lr')}")
    return float(value)


def build(cls: type, first: Any, kwargs: dict[str, Any], option: str) -> Any:
    """``cls(first, **kwargs)``, its own refusal of a value made one line naming ``option``."""
    try:
        return cls(first, **kwargs)
    except (TypeError, ValueError, KeyError) as exc:
        raise UserError(f"{flag(option)}: {cls.__name__} refused its arguments "
                        f"{json.dumps(kwargs, default=str)}: {str(exc).splitlines()[0]}"
                        ) from None
