"""When the training loop pauses between compiled multi-step calls, and what is due at each pause."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from hvd_mnist.config import TrainConfig

# The ranks agree on stop requests about every SYNC_SECONDS of training, so a signal stops the run that soon
# whatever a step costs: every SYNC_EVERY steps until the ranks' pace is known, then every 1, 2 or 5 x 10^k steps
# (up to MAX_SYNC_STEPS) that fit in SYNC_SECONDS at the slowest rank's pace. The interval is also the most steps
# one compiled call runs; at 3 ms a step, agreeing every 10 steps cost 2% of the training (docs/benchmark.md).
SYNC_EVERY = 10
SYNC_SECONDS = 0.25
MAX_SYNC_STEPS = 200


class Action(enum.Enum):
    """What can be due at a pause."""

    LOG = "log"  # the progress line and metrics.jsonl's train event
    SUMMARY = "summary"  # TensorBoard scalars
    SYNC = "sync"  # the ranks agree on stop requests
    HISTOGRAM = "histogram"
    CHECKPOINT = "checkpoint"
    EVAL = "eval"
    COMMIT = "commit"  # an elastic commit
    FAULT = "fault"  # a planned fault (the reliability tests)


REPORTED = frozenset({Action.LOG, Action.SUMMARY, Action.SYNC})  # need the rank-averaged loss and stop votes


@dataclass(frozen=True)
class Cadence:
    """Every periodic action of a run, by step: the one schedule that plans the calls and says what is due.

    An action with period n is due at each multiple of n, a `once` action at its step, and `at_end` at the
    last step. The loop runs the steps up to the next pause in one compiled call, then does what is due, so
    an action added here is both planned for and done.
    """

    periods: Mapping[Action, int]
    last_step: int
    once: Mapping[Action, int] = field(default_factory=dict)
    at_end: frozenset[Action] = frozenset()

    @classmethod
    def of(cls, config: TrainConfig, elastic: bool = False, fault_step: int | None = None) -> Cadence:
        """The actions of a run: progress line, TensorBoard scalars, stop agreement, histograms, checkpoints,
        evaluation, elastic commits and a planned fault (tests)."""
        periods = {Action.LOG: config.log_every, Action.SUMMARY: config.summary_every, Action.SYNC: SYNC_EVERY,
                   Action.HISTOGRAM: config.histogram_every, Action.CHECKPOINT: config.checkpoint_every}
        if config.evaluates:
            periods[Action.EVAL] = config.eval_every
        if elastic:
            periods[Action.COMMIT] = config.commit_every
        once = {Action.FAULT: fault_step} if fault_step is not None else {}
        at_end = {Action.LOG, Action.SYNC, Action.CHECKPOINT} | ({Action.EVAL} if config.evaluates else set())
        return cls(periods, config.steps, once, frozenset(at_end))

    def due(self, step: int) -> frozenset[Action]:
        """The actions due after `step`."""
        actions = {action for action, every in self.periods.items() if step % every == 0}
        actions |= {action for action, at in self.once.items() if at == step}
        if step == self.last_step:
            actions |= self.at_end
        return frozenset(actions)

    def paced(self, seconds_per_step: float) -> Cadence:
        """The same cadence with the stop agreement every sync_steps(seconds_per_step) steps. The loop calls it
        with what every rank got from the same collective, so every rank pauses at the same steps."""
        return dataclasses.replace(self, periods={**self.periods, Action.SYNC: sync_steps(seconds_per_step)})

    def next_pause(self, step: int) -> int:
        """The first step after `step` at which something is due (never beyond the last step)."""
        candidates = [(step // every + 1) * every for every in self.periods.values()]
        candidates += [at for at in self.once.values() if at > step]
        return min(self.last_step, *candidates)


def sync_steps(seconds_per_step: float) -> int:
    """Steps between stop agreements at this pace: the largest of 1, 2, 5, 10, 20, 50, ... up to MAX_SYNC_STEPS
    that fits in SYNC_SECONDS (a round number, so that the agreement falls on the steps where a log line or an
    evaluation pauses anyway); SYNC_EVERY while the pace is unknown."""
    if not seconds_per_step > 0:
        return SYNC_EVERY
    fits = SYNC_SECONDS / seconds_per_step
    steps = [mantissa * 10**power for power in range(4) for mantissa in (1, 2, 5)]
    return max([s for s in steps if s <= min(fits, MAX_SYNC_STEPS)], default=1)
