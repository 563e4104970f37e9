"""When the training loop pauses between compiled multi-step calls, and what is due at each pause."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from hvd_mnist.config import TrainConfig

# Steps between agreements on stop requests (a signal stops the run within this many steps); also the most
# steps one compiled call runs.
SYNC_EVERY = 10


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

    def next_pause(self, step: int) -> int:
        """The first step after `step` at which something is due (never beyond the last step)."""
        candidates = [(step // every + 1) * every for every in self.periods.values()]
        candidates += [at for at in self.once.values() if at > step]
        return min(self.last_step, *candidates)
