"""The loop's one schedule: the compiled multi-step calls end exactly at the steps where something is due."""

import pytest

from hvd_mnist.config import TrainConfig
from hvd_mnist.train.cadence import MAX_SYNC_STEPS, SYNC_EVERY, SYNC_SECONDS, Cadence, sync_steps


def due(cadence: Cadence, step: int) -> set[str]:
    return {action.value for action in cadence.due(step)}


def pauses(cadence: Cadence) -> list[int]:
    step, seen = 0, []
    while step < cadence.last_step:
        step = cadence.next_pause(step)
        seen.append(step)
    return seen


CONFIG = TrainConfig(steps=95, log_every=30, summary_every=40, histogram_every=45, checkpoint_every=25,
                     commit_every=7, eval_every=35)


@pytest.mark.parametrize(("elastic", "fault_step"), [(False, None), (True, 13)])
def test_the_calls_end_exactly_where_something_is_due(elastic, fault_step):
    """Planning and doing read one schedule: every step with an action is a pause, and no other step is."""
    cadence = Cadence.of(CONFIG, elastic=elastic, fault_step=fault_step)
    assert pauses(cadence) == [step for step in range(1, 96) if due(cadence, step)]


def test_what_is_due_and_when():
    cadence = Cadence.of(CONFIG, elastic=True, fault_step=13)
    assert due(cadence, 13) == {"fault"}
    assert due(cadence, 35) == {"eval", "commit"}
    assert due(cadence, 40) == {"summary", "sync"}
    assert due(cadence, 90) == {"log", "sync", "histogram"}
    assert due(cadence, 95) == {"log", "sync", "checkpoint", "eval"}  # the last step
    assert not due(cadence, 94)
    plain = Cadence.of(CONFIG)
    assert "commit" not in due(plain, 35) and "fault" not in due(plain, 13)
    assert due(plain, 95) == {"log", "sync", "checkpoint", "eval"}
    assert "eval" not in due(Cadence.of(TrainConfig(steps=95)), 95)  # no evaluation unless asked


def test_no_call_runs_more_than_the_stop_agreement_interval():
    config = TrainConfig(steps=1000, log_every=500, summary_every=500, histogram_every=500, checkpoint_every=500)
    seen = pauses(Cadence.of(config))
    assert max(b - a for a, b in zip([0, *seen], seen, strict=False)) == SYNC_EVERY
    seen = pauses(Cadence.of(config).paced(0.003))  # 3 ms a step: 83 would fit in SYNC_SECONDS, 50 is taken
    assert max(b - a for a, b in zip([0, *seen], seen, strict=False)) == 50


@pytest.mark.parametrize(("seconds_per_step", "steps"), [
    (0.0, SYNC_EVERY), (float("nan"), SYNC_EVERY),  # pace not known yet
    (SYNC_SECONDS / 83, 50), (SYNC_SECONDS / 20, 20), (SYNC_SECONDS / 19.9, 10), (SYNC_SECONDS / 3, 2),
    (SYNC_SECONDS, 1), (10.0, 1),  # a step slower than the interval: agree after every step
    (1e-6, MAX_SYNC_STEPS),
])
def test_the_stop_agreement_comes_about_every_sync_seconds_of_training(seconds_per_step, steps):
    assert sync_steps(seconds_per_step) == steps
