"""What a command-line run builds beside the training options: the model, the data and
the data kinds' own options (text: blocks and tokenizers, image augmentation, and the
reinforcement-learning options of gym: data), each validated where it is declared."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from ..common.choices import AUGMENTATIONS
from ..common.errors import UserError, flag
from ..common.options import option, require_positive, section
from .train import TrainConfig

#: Data that --augment applies to (images finished on the device).
AUGMENTED_DATA = ("imagefolder:", "cifar10:", "idx:")
#: The longest --seq-len: attention costs seq_len^2 per block, so a mistyped length (a
#: million, one long line of text) would run silently until killed.
MAX_SEQ_LEN = 16_384


# --- reinforcement learning (gym: data, the ppo task; defaults: CleanRL's ppo.py for
# discrete actions, ppo_continuous_action.py for continuous ones). Each option is declared
# once, here; RunConfig refuses them for other data, the runner hands the ppo options to the
# task by these names, and the task's recipe fills in those not given.
@dataclass
class GymOptions:
    """gym: data's options: its environments and evaluation episodes."""

    num_envs: int | None = option(None, "gym: data: environments per process (CleanRL: 4 "
                                        "discrete, 1 continuous)", kind=int, group="rl")
    rollout_steps: int | None = option(None, "gym: data: steps per environment in a rollout "
                                             "(CleanRL: 128 discrete, 2048 continuous)",
                                       kind=int, group="rl")
    vector_env: str | None = option(None, "gym: data: sync (one process, the default) or "
                                          "async (a subprocess per environment)", kind=str,
                                    group="rl", choices=("sync", "async"))
    eval_episodes: int | None = option(None, "gym: data: deterministic episodes per "
                                             "evaluation (default 10)", kind=int, group="rl")


@dataclass
class PpoOptions:
    """The ppo task's options (its hyper-parameters, by CleanRL's names)."""

    env_steps: int | None = option(None, "gym: data: environment steps to train (all "
                                         "processes; sets the run's length; default 500000)",
                                   kind=int, group="rl")
    minibatches: int | None = option(None, "ppo: minibatches per rollout epoch (CleanRL: 4 "
                                           "discrete, 32 continuous)", kind=int, group="rl")
    update_epochs: int | None = option(None, "ppo: epochs over each rollout (CleanRL: 4 "
                                             "discrete, 10 continuous)", kind=int, group="rl")
    gamma: float | None = option(None, "ppo: discount (CleanRL: 0.99)", kind=float, group="rl")
    gae_lambda: float | None = option(None, "ppo: GAE lambda (CleanRL: 0.95)", kind=float,
                                      group="rl")
    clip_coef: float | None = option(None, "ppo: surrogate and value clipping (CleanRL: 0.2)",
                                     kind=float, group="rl")
    ent_coef: float | None = option(None, "ppo: entropy bonus (CleanRL: 0.01 discrete, 0 "
                                          "continuous)", kind=float, group="rl")
    vf_coef: float | None = option(None, "ppo: value-loss weight (CleanRL: 0.5)", kind=float,
                                   group="rl")

    def given(self) -> dict[str, Any]:
        """The options given (the rest: the task's recipe decides)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}


@dataclass
class RunConfig(TrainConfig):
    """A command-line run: the training options plus which model and data to build."""

    model: str = option("cnn", "model name (mlp, cnn, resnet18, resnet50, lstm, transformer, "
                               "gpt, module:pkg.mod.factory, timm:NAME, hf:PATH, "
                               "keras:FILE.keras)", group="run")
    data: str = option("digits", "dataset (digits, synthetic-image, synthetic-seq, idx:DIR, "
                                 "cifar10:DIR, imagefolder:DIR, npz:FILE, csv-text:FILE, "
                                 "text:PATH, tokens:DIR, module:pkg.mod.factory)",
                       group="run")
    val_fraction: float = option(0.2, "validation share when the data has no split", group="run")
    seq_len: int | None = option(None, "text: data: tokens per training block (default 128; "
                                       "at most the model's context)", kind=int, group="run")
    tokenizer: str | None = option(None, "text: data: byte (the default: UTF-8 bytes, "
                                         "vocabulary 256) or hf:DIR (a local Hugging Face "
                                         "tokenizer; an hf: model brings its own)", kind=str,
                                   group="run")
    text_glob: str | None = option(None, "text: data: which files of a directory are read "
                                         "(e.g. '*.py'; default: every text file)", kind=str,
                                   group="run")
    augment: str = option("none", "image data: training-batch augmentation on the device: "
                                  "flip, crop-flip (pad + random crop + flip, CIFAR), rrc-flip "
                                  "(random resized crop + flip, ImageNet)", group="run",
                          choices=AUGMENTATIONS)
    # Reinforcement learning: gym: data's options and the ppo task's, each declared once in
    # its own section (flat names as ever: --num-envs, --clip-coef).
    gym: GymOptions = section(GymOptions)
    ppo: PpoOptions = section(PpoOptions)

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, "seq_len", optional=True)
        if self.seq_len is not None and self.seq_len > MAX_SEQ_LEN:
            raise UserError(f"{flag('seq_len')} {self.seq_len} is over the limit of "
                            f"{MAX_SEQ_LEN} tokens (attention costs seq_len^2 per block)")
        if self.tokenizer is not None and self.tokenizer != "byte" \
                and not self.tokenizer.startswith("hf:"):
            raise UserError(f"{flag('tokenizer')} must be byte or hf:DIR (got "
                            f"{self.tokenizer!r})")
        text_only = [name for name in ("seq_len", "tokenizer", "text_glob")
                     if getattr(self, name) is not None]
        if str(self.data).startswith("tokens:"):  # prepared shards: only the block size
            text_only = [name for name in text_only if name != "seq_len"]
        if text_only and not str(self.data).startswith(("text:", "tokens:")):
            raise UserError(f"{flag(text_only[0])} applies to text: data (language "
                            f"modelling); {flag('data')} is {self.data}")
        if text_only and str(self.data).startswith("tokens:"):
            raise UserError(f"{flag(text_only[0])} was fixed when the shards were prepared "
                            f"(`amptrain prepare`); {flag('data')} is {self.data}")
        if self.augment not in AUGMENTATIONS:
            raise UserError(f"{flag('augment')} must be one of {', '.join(AUGMENTATIONS)} "
                            f"(got {self.augment!r})")
        if self.augment != "none" and not str(self.data).startswith(AUGMENTED_DATA):
            raise UserError(f"{flag('augment')} applies to image files decoded while training "
                            f"({', '.join(d + 'DIR' for d in AUGMENTED_DATA)}); "
                            f"{flag('data')} is {self.data}")
        _check_rl(self)
        if not 0.0 < self.val_fraction < 1.0:
            raise UserError(f"{flag('val_fraction')} must be between 0 and 1 "
                            f"(got {self.val_fraction})")


#: The most evaluation episodes a run plays (--eval-episodes, eval --episodes): each is
#: reset up front, then played one after another on the host. RL papers report 10 to 100;
#: 10,000 puts a mean return's standard error at 1 % of the returns' standard deviation.
MAX_EVAL_EPISODES = 10_000


def check_eval_episodes(episodes: int | None, shown: str) -> None:
    """Refuse more than :data:`MAX_EVAL_EPISODES` episodes, naming the option as
    ``shown`` (``--eval-episodes``, ``--episodes``), before anything is built."""
    if episodes is not None and episodes > MAX_EVAL_EPISODES:
        raise UserError(f"{shown} {episodes} is more than the {MAX_EVAL_EPISODES} "
                        f"evaluation episodes amptrain plays (each is reset up front)")


#: Every reinforcement-learning option (the two sections'), refused for data other than gym:.
RL_OPTIONS = tuple(f.name for cls in (PpoOptions, GymOptions) for f in fields(cls))


def _check_rl(config: RunConfig) -> None:
    values = {**{f.name: getattr(config.ppo, f.name) for f in fields(PpoOptions)},
              **{f.name: getattr(config.gym, f.name) for f in fields(GymOptions)}}
    given = [name for name in RL_OPTIONS if values[name] is not None]
    if not str(config.data).startswith("gym:"):
        if given:
            raise UserError(f"{flag(given[0])} applies to reinforcement learning on gym: "
                            f"data; {flag('data')} is {config.data}")
        return
    require_positive(config.ppo, "env_steps", "minibatches", "update_epochs", optional=True)
    require_positive(config.gym, "num_envs", "rollout_steps", "eval_episodes", optional=True)
    check_eval_episodes(config.gym.eval_episodes, flag("eval_episodes"))
    for name in ("gamma", "gae_lambda"):
        value = values[name]
        if value is not None and not 0.0 <= value <= 1.0:
            raise UserError(f"{flag(name)} must be between 0 and 1 (got {value})")
    for name in ("clip_coef", "ent_coef", "vf_coef"):
        value = values[name]
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise UserError(f"{flag(name)} must be a number >= 0 (got {value})")
