"""Fault injection for tests/distributed/test_ddp.py, loaded only when this directory is on
PYTHONPATH (Python imports ``sitecustomize`` at start-up).

With ``AMPTRAIN_TEST_KILL_RANK=R`` and ``AMPTRAIN_TEST_KILL_STEP=S``, the torchrun worker
of rank R SIGKILLs itself right after optimizer step S -- in the first attempt only, so
the restarted job can finish.
"""
import os

if os.environ.get("AMPTRAIN_TEST_KILL_RANK") is not None:
    import faulthandler
    import signal as _signal

    faulthandler.register(_signal.SIGUSR1)  # the test dumps our stacks if we hang

if (os.environ.get("AMPTRAIN_TEST_KILL_RANK") is not None
        and os.environ.get("RANK") == os.environ["AMPTRAIN_TEST_KILL_RANK"]
        and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0"):
    import signal
    import sys

    from amptrain.trainer import Trainer

    _kill_step = int(os.environ["AMPTRAIN_TEST_KILL_STEP"])
    _after_step = Trainer._after_step

    def _after_step_then_die(self):
        _after_step(self)
        if self.step == _kill_step:
            print(f"fault injection: killed rank {os.environ['RANK']} at step {self.step}",
                  file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    Trainer._after_step = _after_step_then_die
