"""trainer/position.py: where the loop is, as checkpoints hold it, and where it ends."""
from __future__ import annotations

import pytest

from amptrain.common.errors import UserError
from amptrain.trainer.position import LoopPosition, RunLength


def test_steps_epochs_and_their_checkpoint_entries():
    position = LoopPosition()
    position.advance()
    position.advance()
    position.next_epoch()
    assert (position.step, position.epoch, position.window_in_epoch, position.step_epoch) \
        == (2, 1, 0, 0)  # the last trained step was in epoch 0
    position.advance()
    assert position.state_dict() == {"step": 3, "epoch": 1, "window_in_epoch": 1,
                                     "step_epoch": 1}
    again = LoopPosition()
    again.load_state_dict(position.state_dict())
    assert again == position


@pytest.mark.parametrize("log_window, step_epoch", [({"step_epoch": 1}, 1), (None, 0)])
def test_a_format_1_position_is_migrated_from_the_top_and_the_log_window(log_window,
                                                                          step_epoch):
    from amptrain.checkpoint import StateRegistry

    position = LoopPosition()
    registry = StateRegistry()
    registry.register(position)
    registry.load_state_dict({"step": 3, "epoch": 1, "window_in_epoch": 1,
                              "log_window": log_window})
    assert (position.step, position.epoch, position.window_in_epoch, position.step_epoch) \
        == (3, 1, 1, step_epoch)


# ------------------------------------------------------------ the run's length
@pytest.mark.parametrize("epochs, max_steps, per_epoch, total, bound, why", [
    (None, None, 23, 69, 3, "3 epochs of 23 steps, the default"),
    (2, None, 23, 46, 2, "epochs 2 of 23 steps"),
    (None, 120, 23, 120, 6, "max_steps 120; 5.2 epochs of 23 steps"),    # alone: it decides
    (None, 46, 23, 46, 2, "max_steps 46; 2 epochs of 23 steps"),
    (2, 200, 23, 46, 2, "the fewer of max_steps 200 and epochs 2 of 23 steps"),  # both: min
    (2, 30, 23, 30, 2, "the fewer of max_steps 30 and epochs 2 of 23 steps"),
    (None, 8, None, 8, None, "max_steps 8; the stream is read as often as they need"),
    (3, 8, None, 8, 3, "at most: max_steps 8 or epochs 3 over the stream, whichever ends first"),
])
def test_max_steps_alone_decides_the_length_both_given_the_fewer(epochs, max_steps, per_epoch,
                                                                 total, bound, why):
    length = RunLength.resolve(epochs, max_steps, per_epoch)
    assert (length.total_steps, length.epochs, length.why) == (total, bound, why)


def test_the_run_ends_at_its_steps_or_its_epoch_bound():
    length = RunLength.resolve(2, 30, 23)
    assert not length.reached(LoopPosition(step=29, epoch=1))
    assert length.reached(LoopPosition(step=30, epoch=1))
    assert length.reached(LoopPosition(step=12, epoch=2))  # a shorter epoch (a stream)
    endless = RunLength.resolve(None, 8, None)
    assert not endless.reached(LoopPosition(step=7, epoch=100))
    assert (length.epoch_label(0), endless.epoch_label(4)) == ("epoch 0 (0-1)", "epoch 4")


def test_a_stream_without_max_steps_has_no_length():
    with pytest.raises(UserError, match="max_steps"):
        RunLength.resolve(3, None, None)
