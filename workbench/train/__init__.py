"""The training loop, callbacks, checkpoints, configs, and the live fit session notebooks drive."""

from workbench.train.config import ExperimentConfig, TrainingConfig, load_yaml
from workbench.train.context import ContextConfig
from workbench.train.experiment import AdapterExperiment
from workbench.train.live import FitSession

__all__ = ["AdapterExperiment", "ContextConfig", "ExperimentConfig", "FitSession", "TrainingConfig",
           "load_yaml"]
