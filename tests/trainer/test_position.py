"""trainer/position.py: where the loop is, as checkpoints hold it."""
from __future__ import annotations

from amptrain.trainer.position import LoopPosition


def test_steps_epochs_and_their_checkpoint_entries():
    position = LoopPosition()
    position.advance()
    position.advance()
    position.next_epoch()
    assert (position.step, position.epoch, position.window_in_epoch, position.step_epoch) \
        == (2, 1, 0, 0)  # the last trained step was in epoch 0
    position.advance()
    assert position.state_dict() == {"step": 3, "epoch": 1, "window_in_epoch": 1}
    again = LoopPosition()
    again.load_state_dict({**position.state_dict(), "log_window": {"step_epoch": 1}})
    assert again == position
