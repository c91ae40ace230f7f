"""Multi-turn GRPO on TRL: the config, the trainer and ``train_multi_turn`` (``train`` extra).

``trainers.GRPOConfig`` is the cookbook's name for :class:`MultiTurnGRPOConfig`.
"""

import trainers.grpo.rejection_sampling  # noqa: F401  (registers credit_assignment: rejection_sampling)
from trainers.async_rl.weight_sync import WeightSyncType
from trainers.distillation.config import DistillationConfig
from trainers.grpo.config.multi_turn import MultiTurnGRPOConfig
from trainers.grpo.train import load_tasks, train_multi_turn
from trainers.mixture.env import MixtureEnv

GRPOConfig = MultiTurnGRPOConfig


_TEACHER = ("Teacher", "HFTeacher", "EndpointTeacher", "teacher_from_config")


def __getattr__(name: str):  # the trainer imports TRL's heavy trainer stack: load it on use
    if name == "MultiTurnGRPOTrainer":
        from trainers.grpo.trainer import MultiTurnGRPOTrainer

        return MultiTurnGRPOTrainer
    if name in _TEACHER:
        import trainers.distillation.teacher

        return getattr(trainers.distillation.teacher, name)
    raise AttributeError(f"module 'trainers' has no attribute {name!r}")


__all__ = [
    "MultiTurnGRPOConfig",
    "GRPOConfig",
    "MultiTurnGRPOTrainer",
    "train_multi_turn",
    "load_tasks",
    "MixtureEnv",
    "WeightSyncType",
    "DistillationConfig",
    *_TEACHER,
]
