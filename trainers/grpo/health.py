"""Health checks over the step log: the silent failures of multi-turn RL, named while a run goes.

Each check is a small pure function of the step log's history (the records the trainer appends
to ``trainer.state.log_history``, oldest first, the latest last) that returns a :class:`Finding`
when the run shows the failure it watches for, else None. The thresholds are the module's
constants, documented where they are defined. :class:`HealthCallback` runs the registry after
every logged record: a check fires once per run, as a ``health/<check>`` metric in that record
(the value it measured) and one :class:`HealthWarning` naming the likely cause and what to try;
with ``health_action="stop"`` the run then ends cleanly with a checkpoint.

A check reads only keys the record has, so each applies where its metrics exist: the GRPO
trainer (lockstep, async and on-policy distillation alike) logs all of them; SFT logs ``loss``
and ``grad_norm`` only (:data:`HealthCheck.trainers`). ``docs/guides/health.md`` lists them.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import TrainerCallback

from llm_gym.errors import InvalidArgumentError

__all__ = [
    "HEALTH_ACTIONS",
    "HEALTH_CHECKS",
    "Finding",
    "HealthCallback",
    "HealthCheck",
    "HealthWarning",
    "check_health_action",
    "register_health_check",
    "run_health_checks",
    "series",
]

History = Sequence[Mapping[str, Any]]
"""The step log, oldest record first."""

HEALTH_ACTIONS = ("warn", "stop", "off")
"""``health_action``'s values: warn and go on, warn and end the run with a checkpoint, no checks."""

WINDOW = 3
"""Records a recent (or starting) mean covers: one noisy step never fires a check."""
TOOL_CALLS_FRACTION = 0.5
"""``tool_use_collapse``: tool calls per episode below this fraction of their starting mean..."""
TOOL_CALLS_MIN_START = 0.5
"""...from a start of at least this many calls per episode..."""
REWARD_RISE = 0.05
"""...while the mean reward rose by at most this much (a policy that answers without tools and
scores better is learning, not collapsing)."""
ENTROPY_FLOOR = 0.05
"""``entropy_collapse``: mean token entropy (nats) of the trained completions below this."""
CAPPED_TURN_SHARE = 0.5
"""``length_at_cap``: share of assistant turns that stopped at ``max_tokens_per_turn``."""
SPIKE_RISE = 0.25
"""``truncation_spike`` / ``parse_failure_spike``: the latest ratio this far (absolute) above
the mean of the records before it (at least :data:`WINDOW` of them, at most :data:`SPIKE_BASE`)."""
SPIKE_BASE = 5
"""Records the spike checks' baseline covers at most."""
ZERO_VARIANCE_SHARE = 0.9
"""``zero_variance_groups``: share of collected groups whose rewards were all equal."""
LOGPROB_GAP_BOUND = 0.1
"""``logprob_gap``: mean absolute difference (nats per token) between the sampler's and the
trainer's logprobs of the sampled tokens."""
VAL_DROP = 0.1
"""``reward_up_val_down``: held-out success this far below its best earlier value..."""
TRAIN_REWARD_RISE = 0.1
"""...while the training reward's recent mean is this far above its starting mean."""


@dataclass(frozen=True)
class Finding:
    """What a check saw when it fired."""

    value: float
    """The measured value (logged as ``health/<check>``)."""
    detail: str
    """The numbers behind it, in words."""


@dataclass(frozen=True)
class HealthCheck:
    """One registered check."""

    name: str
    """Its name (the metric is ``health/<name>``)."""
    run: Callable[[History], Finding | None]
    """The pure function over the history."""
    cause: str
    """The likely cause, for the warning."""
    remedy: str
    """What to try."""
    trainers: tuple[str, ...]
    """The trainers it applies to: ``"rl"`` (GRPO, async, distillation), ``"sft"``."""


HEALTH_CHECKS: dict[str, HealthCheck] = {}
"""The registry, by name, in registration order."""


class HealthWarning(UserWarning):
    """A health check fired."""


def register_health_check(
    name: str, *, cause: str, remedy: str, trainers: tuple[str, ...] = ("rl",)
) -> Callable[[Callable[[History], Finding | None]], Callable[[History], Finding | None]]:
    """Register the decorated function as the check ``name``."""

    def add(run: Callable[[History], Finding | None]) -> Callable[[History], Finding | None]:
        HEALTH_CHECKS[name] = HealthCheck(name, run, cause, remedy, trainers)
        return run

    return add


def check_health_action(value: Any) -> str:
    """``value`` when it is one of :data:`HEALTH_ACTIONS`, else an error naming them."""
    if value not in HEALTH_ACTIONS:
        raise InvalidArgumentError(
            f"health_action must be one of {list(HEALTH_ACTIONS)}, actual value: {value!r}."
        )
    return value


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def series(history: History, *keys: str) -> list[tuple[float, ...]]:
    """The finite values of ``keys`` in each record that has all of them, oldest first.

    Example:
        >>> series([{"a": 1.0, "b": 2}, {"a": 3.0}, {"a": float("nan"), "b": 1}], "a", "b")
        [(1.0, 2.0)]
    """
    rows: list[tuple[float, ...]] = []
    for record in history:
        values = tuple(v for v in (_number(record.get(key)) for key in keys) if v is not None)
        if len(values) == len(keys):
            rows.append(values)
    return rows


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _recent(history: History, key: str) -> float | None:
    """The mean of ``key``'s last :data:`WINDOW` values (None with fewer)."""
    values = [v for (v,) in series(history, key)]
    return _mean(values[-WINDOW:]) if len(values) >= WINDOW else None


@register_health_check(
    "tool_use_collapse",
    cause="the policy learns to answer without calling tools (a tool turn that rarely pays "
    "teaches the group baseline to skip it)",
    remedy="a reward for tool use or for reading tool results, per_turn credit, or more SFT "
    "on tool-using transcripts",
)
def tool_use_collapse(history: History) -> Finding | None:
    """Tool calls per episode fell below :data:`TOOL_CALLS_FRACTION` of their start (the mean
    of the first :data:`WINDOW` records, at least :data:`TOOL_CALLS_MIN_START`) while the
    reward rose by at most :data:`REWARD_RISE` (first vs last :data:`WINDOW` records)."""
    rows = series(history, "episodes/tool_calls_mean", "reward")
    if len(rows) < 2 * WINDOW:
        return None
    calls, rewards = [r[0] for r in rows], [r[1] for r in rows]
    start, now = _mean(calls[:WINDOW]), _mean(calls[-WINDOW:])
    r0, r1 = _mean(rewards[:WINDOW]), _mean(rewards[-WINDOW:])
    fell = start >= TOOL_CALLS_MIN_START and now < TOOL_CALLS_FRACTION * start
    if fell and r1 <= r0 + REWARD_RISE:
        return Finding(now, f"tool calls per episode {start:.2f} -> {now:.2f}, reward {r0:.3f} "
                            f"-> {r1:.3f}")  # fmt: skip
    return None


@register_health_check(
    "entropy_collapse",
    cause="the policy became (near) deterministic: every sample of a group says the same, so "
    "groups stop carrying a learning signal",
    remedy="a lower learning rate, a higher temperature, beta > 0 (KL to the reference), or "
    "epsilon_high above epsilon (clip-higher)",
)
def entropy_collapse(history: History) -> Finding | None:
    """The mean token ``entropy`` of the last :data:`WINDOW` records fell below
    :data:`ENTROPY_FLOOR` nats."""
    now = _recent(history, "entropy")
    if now is not None and now < ENTROPY_FLOOR:
        return Finding(now, f"entropy {now:.4f} nats per token (floor {ENTROPY_FLOOR})")
    return None


@register_health_check(
    "length_at_cap",
    cause="replies grow until max_tokens_per_turn cuts them (a rambling or looping policy; a "
    "reward that pays length)",
    remedy="a larger max_tokens_per_turn if the replies need it, else the soft overlong "
    "penalty (overlong_buffer), overlong_masking, or a length-neutral reward",
)
def length_at_cap(history: History) -> Finding | None:
    """``episodes/capped_turn_ratio`` (assistant turns cut at the token cap) averaged at least
    :data:`CAPPED_TURN_SHARE` over the last :data:`WINDOW` records."""
    now = _recent(history, "episodes/capped_turn_ratio")
    if now is not None and now >= CAPPED_TURN_SHARE:
        return Finding(now, f"{now:.0%} of assistant turns stopped at the token cap")
    return None


def _spike(history: History, key: str) -> Finding | None:
    values = [v for (v,) in series(history, key)]
    if len(values) < WINDOW + 1:
        return None
    base = _mean(values[-1 - SPIKE_BASE : -1])
    if values[-1] - base >= SPIKE_RISE:
        return Finding(values[-1], f"{key} {base:.3f} -> {values[-1]:.3f}")
    return None


@register_health_check(
    "truncation_spike",
    cause="episodes suddenly stop ending on their own: a context or turn limit now binds, an "
    "environment times out, or a policy backend fails",
    remedy="read the truncation causes (*_ratio, episodes/*_ratio) for which one rose; raise "
    "the limit that binds or fix the failing service",
)
def truncation_spike(history: History) -> Finding | None:
    """``truncated_ratio`` rose by :data:`SPIKE_RISE` or more over the mean of the records
    before it."""
    return _spike(history, "truncated_ratio")


@register_health_check(
    "parse_failure_spike",
    cause="the policy stopped writing actions the action format parses (a drifting format, "
    "replies cut at the token cap)",
    remedy="check the action format the template teaches (action_format), raise "
    "max_tokens_per_turn, or a lower learning rate",
)
def parse_failure_spike(history: History) -> Finding | None:
    """``parse_failure_ratio`` rose by :data:`SPIKE_RISE` or more over the mean of the records
    before it."""
    return _spike(history, "parse_failure_ratio")


@register_health_check(
    "zero_variance_groups",
    cause="nearly every group's episodes got the same reward (all solved or all failed), so "
    "their advantages are zero and the steps teach nothing",
    remedy="harder or easier tasks (a curriculum), larger groups (episodes_per_task), dynamic "
    "sampling (max_sampling_attempts > 1), or a denser reward",
)
def zero_variance_groups(history: History) -> Finding | None:
    """``zero_variance_skip_ratio`` averaged at least :data:`ZERO_VARIANCE_SHARE` over the last
    :data:`WINDOW` records."""
    now = _recent(history, "zero_variance_skip_ratio")
    if now is not None and now >= ZERO_VARIANCE_SHARE:
        return Finding(now, f"{now:.0%} of collected groups had no reward variance")
    return None


@register_health_check(
    "logprob_gap",
    cause="the sampler's logprobs and the trainer's disagree (kernels or precision differ, "
    "weights are not synced, or async groups are too stale)",
    remedy="check the weight sync, keep vllm_importance_sampling_correction on, lower "
    "max_steps_off_policy, or match the sampler's dtype to the trainer's",
)
def logprob_gap(history: History) -> Finding | None:
    """``sampling/sampling_logp_difference/mean`` averaged above :data:`LOGPROB_GAP_BOUND` over
    the last :data:`WINDOW` records."""
    now = _recent(history, "sampling/sampling_logp_difference/mean")
    if now is not None and now > LOGPROB_GAP_BOUND:
        return Finding(now, f"mean |sampler - trainer| logprob {now:.3f} nats per token")
    return None


@register_health_check(
    "reward_up_val_down",
    cause="the policy overfits the training tasks or exploits the reward (reward hacking)",
    remedy="compare train and validation episodes in the run report; more varied training "
    "tasks, a stricter reward, or stop at the best validation step",
)
def reward_up_val_down(history: History) -> Finding | None:
    """``val/success_rate`` fell :data:`VAL_DROP` or more below its best earlier value while the
    training reward's last :data:`WINDOW` records average :data:`TRAIN_REWARD_RISE` or more
    above its first."""
    val = [v for (v,) in series(history, "val/success_rate")]
    rewards = [v for (v,) in series(history, "reward")]
    if len(val) < 2 or len(rewards) < 2 * WINDOW:
        return None
    best, now = max(val[:-1]), val[-1]
    r0, r1 = _mean(rewards[:WINDOW]), _mean(rewards[-WINDOW:])
    if best - now >= VAL_DROP and r1 - r0 >= TRAIN_REWARD_RISE:
        return Finding(now, f"validation success {best:.3f} -> {now:.3f} while reward "
                            f"{r0:.3f} -> {r1:.3f}")  # fmt: skip
    return None


@register_health_check(
    "nonfinite_loss",
    cause="the loss or gradient overflowed (a too high learning rate, fp16 overflow, a "
    "non-finite reward)",
    remedy="a lower learning_rate, max_grad_norm, bf16 instead of fp16, and check the rewards "
    "for NaN",
    trainers=("rl", "sft"),
)
def nonfinite_loss(history: History) -> Finding | None:
    """The latest record's ``loss`` or ``grad_norm`` is NaN or infinite (the finding's value is
    1.0: the step log holds no NaN)."""
    if not history:
        return None
    for key in ("loss", "grad_norm"):
        value = history[-1].get(key)
        if isinstance(value, float) and not math.isfinite(value):
            return Finding(1.0, f"{key} is {value}")
    return None


def run_health_checks(
    history: History, trainer: str = "rl", skip: frozenset[str] | set[str] = frozenset()
) -> list[tuple[HealthCheck, Finding]]:
    """The checks for ``trainer`` that fire on ``history``, those in ``skip`` left out."""
    fired = []
    for check in HEALTH_CHECKS.values():
        if trainer in check.trainers and check.name not in skip:
            finding = check.run(history)
            if finding is not None:
                fired.append((check, finding))
    return fired


class HealthCallback(TrainerCallback):
    """Runs :func:`run_health_checks` after each logged record (the end-of-run summary aside).

    A check that fires adds ``health/<check>`` to the record (in ``log_history`` and in what
    later callbacks receive: the trainer puts this callback first) and warns once (the main
    process); with ``action="stop"`` training ends after the step with a checkpoint.

    Args:
        action: One of :data:`HEALTH_ACTIONS`.
        trainer: ``"rl"`` or ``"sft"``: the checks that apply.
    """

    def __init__(self, action: str = "warn", trainer: str = "rl") -> None:
        self.action = check_health_action(action)
        self.trainer = trainer
        self.fired: list[dict[str, Any]] = []
        """``{"step", "check", "value", "detail", "cause", "remedy"}`` for each check that
        fired, in order."""

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> Any:
        if self.action == "off" or not state.log_history or "train_runtime" in (logs or {}):
            return control
        record = state.log_history[-1]
        skip = {f["check"] for f in self.fired}
        for check, finding in run_health_checks(state.log_history, self.trainer, skip):
            key = f"health/{check.name}"
            record[key] = finding.value
            if logs is not None:
                logs[key] = finding.value
            step = state.global_step
            self.fired.append({"step": step, "check": check.name, "value": finding.value,
                               "detail": finding.detail, "cause": check.cause,
                               "remedy": check.remedy})  # fmt: skip
            if state.is_world_process_zero:
                stop = (
                    " health_action=stop: the run ends after this step with a checkpoint."
                    if self.action == "stop"
                    else ""
                )
                warnings.warn(
                    f"health check {check.name} fired at step {step}: {finding.detail}. Likely "
                    f"cause: {check.cause}. Try: {check.remedy}.{stop}",
                    HealthWarning,
                    stacklevel=2,
                )
            if self.action == "stop":
                control.should_training_stop = True
                control.should_save = True
        return control
