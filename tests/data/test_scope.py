"""data/scope.py: which --data an option section applies to, and the refusal elsewhere."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from amptrain.common.errors import UserError, cli_spelling
from amptrain.common.options import option
from amptrain.data.scope import DataScope


@dataclass
class Toy:
    size: int | None = option(None, "toy: size", kind=int)
    mode: str = option("plain", "toy: mode")


SCOPE = DataScope("toy: data", ("toy:", "toys:"),
                  decided={"baked:": (("size",), "was baked in")})


def test_options_at_their_defaults_apply_anywhere():
    SCOPE.check(Toy(), "digits")


def test_a_set_option_applies_to_its_prefixes_only():
    SCOPE.check(Toy(size=3, mode="fancy"), "toys:a")
    with pytest.raises(UserError) as caught:
        SCOPE.check(Toy(mode="fancy"), "digits")
    assert str(caught.value) == "mode applies to toy: data; data is digits"
    with cli_spelling(), pytest.raises(UserError, match="^--size applies to toy: data; "
                                                        "--data is digits$"):
        SCOPE.check(Toy(size=3), "digits")


def test_where_some_options_were_decided_only_the_others_apply():
    SCOPE.check(Toy(size=3), "baked:x")
    with pytest.raises(UserError) as caught:
        SCOPE.check(Toy(size=3, mode="fancy"), "baked:x")
    assert str(caught.value) == "mode was baked in; data is baked:x"
