"""The training loop, callbacks, checkpoints and configs."""

from workbench.train.config import ExperimentConfig, TrainingConfig, load_yaml
from workbench.train.experiment import AdapterExperiment

__all__ = ["AdapterExperiment", "ExperimentConfig", "TrainingConfig", "load_yaml"]
