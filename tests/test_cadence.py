"""The training loop runs several steps per call, but stops at every step whose results it must see."""

from hvd_mnist.config import TrainConfig
from hvd_mnist.train import SYNC_EVERY, _next_look


def looks(config: TrainConfig, elastic: bool, fault_step: int | None) -> list[int]:
    step, seen = 0, []
    while step < config.steps:
        step = _next_look(step, config, elastic, fault_step)
        seen.append(step)
    return seen


def test_every_report_checkpoint_commit_fault_and_the_end_is_a_look():
    config = TrainConfig(steps=95, log_every=30, summary_every=40, histogram_every=45, checkpoint_every=25,
                         commit_every=7)
    expected = {*range(SYNC_EVERY, 95, SYNC_EVERY), 30, 60, 90, 40, 80, 45, 25, 50, 75, 95}
    assert looks(config, elastic=False, fault_step=None) == sorted(expected)
    with_commits_and_fault = expected | set(range(7, 95, 7)) | {13}
    assert looks(config, elastic=True, fault_step=13) == sorted(with_commits_and_fault)


def test_no_call_runs_more_than_the_stop_agreement_interval():
    config = TrainConfig(steps=1000, log_every=500, summary_every=500, histogram_every=500, checkpoint_every=500)
    seen = looks(config, elastic=False, fault_step=None)
    assert max(b - a for a, b in zip([0, *seen], seen, strict=False)) == SYNC_EVERY
