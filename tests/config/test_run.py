"""RunConfig (amptrain/config/run.py): what a command-line run builds beside the training
options, composed of the data sources' and the ppo task's sections (each declared and
checked beside its owner), and the refusal of an option for data it does not apply to."""
from __future__ import annotations

import pytest

from amptrain.config import RunConfig, TrainConfig, config_fields
from amptrain.data.gym_options import MAX_EVAL_EPISODES
from amptrain.data.text_options import MAX_SEQ_LEN
from amptrain.common.errors import UserError, cli_spelling


def test_run_config_adds_model_data_and_validation_share():
    config = RunConfig.from_options(model="mlp", data="digits", seed=3, val_fraction="0.1")
    assert type(config) is RunConfig and isinstance(config, TrainConfig)
    assert (config.model, config.data, config.seed, config.val_fraction) == \
        ("mlp", "digits", 3, 0.1)
    default = RunConfig()
    assert (default.model, default.data, default.val_fraction) == ("cnn", "digits", 0.2)
    own = [name for name in config_fields(RunConfig) if name not in config_fields(TrainConfig)]
    assert own[:7] == ["model", "data", "val_fraction", "seq_len", "tokenizer", "text_glob",
                       "augment"]  # then the reinforcement-learning options (gym: data)
    assert config_fields(RunConfig)["model"].metadata["group"] == "run"


def test_task_options_are_checked_when_built():
    from amptrain.config import RunConfig, build_config

    config = build_config(RunConfig, {"data": "text:notes.txt", "task": "lm", "seq_len": 64,
                                      "tokenizer": "hf:tok", "text_glob": "*.py"})
    assert (config.task, config.text.seq_len, config.text.tokenizer, config.text.text_glob) == \
        ("lm", 64, "hf:tok", "*.py")
    assert build_config(RunConfig, {"loss": "huber"}).loss == "huber"
    for values, fragment in [({"task": "ranking"}, "task must be one of auto, classification, "
                                                   "regression, lm"),
                             ({"loss": "hinge"}, "loss must be one of mse, l1, huber"),
                             ({"data": "text:x", "seq_len": 0}, "seq_len must be an integer >= 1"),
                             ({"data": "text:x", "tokenizer": "words"},
                              "tokenizer must be byte or hf:DIR"),
                             ({"text_glob": "*.py"}, "text_glob applies to text: data")]:
        with pytest.raises(UserError, match=fragment):
            build_config(RunConfig, values)


def test_the_rl_options_are_checked_where_declared():
    config = RunConfig.from_options(data="gym:CartPole-v1", gamma=0.98, clip_coef=0.1,
                                    env_steps=4096, minibatches=8)
    ppo = config.ppo
    assert (ppo.gamma, ppo.clip_coef, ppo.env_steps, ppo.minibatches) == (0.98, 0.1, 4096, 8)
    for values, fragment in [({"gamma": 1.5}, "gamma must be between 0 and 1"),
                             ({"gae_lambda": -0.1}, "gae_lambda must be between 0 and 1"),
                             ({"ent_coef": -1.0}, "ent_coef must be a number >= 0"),
                             ({"vf_coef": float("nan")}, "vf_coef must be a number >= 0"),
                             ({"env_steps": 0}, "env_steps must be an integer >= 1"),
                             ({"num_envs": -2}, "num_envs must be an integer >= 1")]:
        with pytest.raises(UserError, match=fragment):
            RunConfig.from_options(data="gym:CartPole-v1", **values)
    # An RL option on other data does nothing there: refused, naming it.
    with pytest.raises(UserError, match="gamma applies to reinforcement learning on gym: "
                                        "data; data is digits"):
        RunConfig.from_options(data="digits", gamma=0.9)


def test_seq_len_is_bounded():
    assert RunConfig.from_options(data="text:x", seq_len=MAX_SEQ_LEN).text.seq_len == MAX_SEQ_LEN
    with pytest.raises(UserError, match="over the limit"):
        RunConfig.from_options(data="text:x", seq_len=MAX_SEQ_LEN + 1)


def test_eval_episodes_is_bounded_where_declared():
    # Issue 48: refused with the options, before any command prints, claims --out or
    # builds an environment (compare used to say its timing line first).
    assert RunConfig.from_options(data="gym:CartPole-v1", eval_episodes=MAX_EVAL_EPISODES
                                  ).gym.eval_episodes == 10_000
    with pytest.raises(UserError, match="^eval_episodes 10001 is more than the 10000 "
                                        "evaluation episodes amptrain plays"):
        RunConfig.from_options(data="gym:CartPole-v1", eval_episodes=10_001)
    with cli_spelling(), pytest.raises(UserError, match="^--eval-episodes 1000000 is more"):
        RunConfig.from_options(data="gym:CartPole-v1", eval_episodes=1_000_000)


def test_the_sections_are_their_owners_declarations():
    from amptrain.data import GymOptions, ImageOptions, TextOptions
    from amptrain.tasks.ppo_options import PpoOptions

    config = RunConfig.from_options(data="text:x", seq_len=64)
    assert (type(config.text), type(config.images), type(config.gym), type(config.ppo)) == \
        (TextOptions, ImageOptions, GymOptions, PpoOptions)
    assert config.text.seq_len == 64 and config.images.augment == "none"


@pytest.mark.parametrize("values, message", [
    ({"data": "tokens:shards", "tokenizer": "byte"},
     "tokenizer was fixed when the shards were prepared (`amptrain prepare`); data is "
     "tokens:shards"),
    ({"data": "digits", "augment": "flip"},
     "augment applies to image files decoded while training (imagefolder:DIR, cifar10:DIR, "
     "idx:DIR); data is digits"),
    # the ppo task's option is named before gym: data's, as both were one list before
    ({"data": "digits", "num_envs": 2, "clip_coef": 0.1},
     "clip_coef applies to reinforcement learning on gym: data; data is digits"),
])
def test_an_option_for_other_data_is_refused_naming_both(values, message):
    with pytest.raises(UserError) as caught:
        RunConfig.from_options(**values)
    assert str(caught.value) == message


def test_options_that_apply_are_taken_for_their_data():
    assert RunConfig.from_options(data="tokens:shards", seq_len=32).text.seq_len == 32
    assert RunConfig.from_options(data="idx:mnist", augment="flip").images.augment == "flip"
    assert RunConfig.from_options(data="gym:CartPole-v1", num_envs=2).gym.num_envs == 2
