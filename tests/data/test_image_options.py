"""data/image_options.py: image data's --augment, checked where it is declared."""
from __future__ import annotations

import pytest

from amptrain.common.errors import UserError
from amptrain.data.image_options import ImageOptions


def test_augment_is_one_of_the_augmentations():
    assert ImageOptions(augment="rrc-flip").augment == "rrc-flip"
    with pytest.raises(UserError) as caught:
        ImageOptions(augment="mixup")
    assert str(caught.value) == ("augment must be one of none, flip, crop-flip, rrc-flip "
                                 "(got 'mixup')")
