"""Where a run's metrics go: verl-style loggers, grouped metric names, a sample table per step."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from arbor.config.base import Section, Url

Logger = Literal["console", "tensorboard", "wandb", "mlflow"]


class TrackingConfig(Section):
    loggers: list[Logger] = Field(
        default_factory=lambda: ["console", "tensorboard"],
        description="where step metrics go: console (a line per step), tensorboard ({ARBOR_HOME}/tb/<run>), wandb "
        "and mlflow (the tracking extra: pip install -c constraints.txt '.[tracking]' in arbor's checkout); the steps "
        "table stays the source of truth")
    project: str = Field("arbor", min_length=1, description="the W&B project and the MLflow experiment")
    experiment: str | None = Field(None, description="the run's name in W&B / MLflow (default: the run id)")
    samples_per_step: int = Field(4, ge=0, description="generations logged per step in the sample table (one per "
                                  "group from the first groups: question, answer, gold, rewards, rubric scores)")
    wandb_mode: Literal["online", "offline", "disabled"] | None = Field(
        None, description="W&B mode (None: W&B's own setting, e.g. WANDB_MODE); offline writes under "
        "{ARBOR_HOME}/wandb for `wandb sync` later")
    mlflow_tracking_uri: Url | None = Field(
        None, description="MLflow tracking URI (None: MLFLOW_TRACKING_URI, else a local SQLite store "
        "{ARBOR_HOME}/mlflow/mlflow.db with artifacts beside it)")
