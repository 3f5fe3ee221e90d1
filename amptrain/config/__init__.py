"""Validated configuration, shared by the library, the command line and YAML files.

Each option is declared once (:func:`~amptrain.common.options.option`); its flag, YAML key
and library keyword are generated from that declaration under one flat name, while code
reads the nested sections (``config.batching.batch_size``).
"""
from ..common.options import (
                      build_config,
                      cli_flag,
                      coerce,
                      config_fields,
                      given_options,
                      option,
                      option_paths,
                      replace_options,
                      section,
                      to_dict,
                      with_options,
)
from ..common.yaml_files import RESOLVED_ONLY_KEYS, load_yaml, write_yaml
from .train import (
                      DEFAULT_LR,
                      LR_SCALING,
                      MAX_SEED,
                      OPTIMIZERS,
                      SCHEDULERS,
                      STRATEGIES,
                      BatchingConfig,
                      CheckpointConfig,
                      DistributedConfig,
                      LoggingConfig,
                      MicroBatchSplit,
                      PrecisionConfig,
                      ScheduleConfig,
                      TrainConfig,
)
from .run import RunConfig

__all__ = ["RESOLVED_ONLY_KEYS", "build_config", "cli_flag", "coerce", "config_fields",
           "given_options", "load_yaml", "option", "option_paths", "replace_options", "section",
           "to_dict",
           "with_options", "write_yaml", "DEFAULT_LR", "LR_SCALING", "MAX_SEED", "OPTIMIZERS",
           "SCHEDULERS", "STRATEGIES", "BatchingConfig", "CheckpointConfig", "DistributedConfig",
           "LoggingConfig", "MicroBatchSplit", "PrecisionConfig", "RunConfig", "ScheduleConfig",
           "TrainConfig"]
