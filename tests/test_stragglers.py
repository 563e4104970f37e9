"""The straggler rule on given paces: named after WINDOW slow paces in a row, once; noise and microsecond steps
never; named again after it kept pace; a world that changed size starts over."""

from __future__ import annotations

from hvd_mnist.train.telemetry.stragglers import WINDOW, Stragglers

EVEN = [(0.0020, 0.0019), (0.0021, 0.0018)]
SLOW_RANK_1 = [(0.0020, 0.0072), (0.0073, 0.0019)]


def test_a_rank_slow_in_window_paces_in_a_row_is_named_once():
    stragglers = Stragglers()
    said = [stragglers.observe(SLOW_RANK_1) for _ in range(WINDOW + 3)]
    assert said[:WINDOW - 1] == [None] * (WINDOW - 1)
    assert said[WINDOW - 1] == ("rank 1 is a straggler: 7.3 ms of compute per step against 2.0 ms on the others; "
                                "the job runs at its pace, 5.3 ms a step slower")
    assert said[WINDOW:] == [None] * 3


def test_noise_below_the_ratio_or_the_margin_and_one_fast_pace_name_nobody():
    stragglers = Stragglers()
    noisy = [(0.0020, 0.002), (0.0029, 0.002)]  # 1.45x: a bad spell on a shared machine
    tiny = [(0.00001, 0.0), (0.00005, 0.0)]  # 5x, but 40 microseconds
    paces = [noisy] * 10 + [tiny] * 10 + [SLOW_RANK_1] * (WINDOW - 1) + [EVEN] + [SLOW_RANK_1] * (WINDOW - 1)
    assert [stragglers.observe(pace) for pace in paces] == [None] * len(paces)


def test_a_straggler_that_kept_pace_is_named_again_when_it_falls_behind_again():
    stragglers = Stragglers()
    said = [stragglers.observe(pace) for pace in [SLOW_RANK_1] * WINDOW + [EVEN] + [SLOW_RANK_1] * WINDOW]
    assert [index for index, line in enumerate(said) if line] == [WINDOW - 1, 2 * WINDOW]


def test_a_world_that_changed_size_starts_over_and_one_rank_names_nobody():
    stragglers = Stragglers()
    for _ in range(WINDOW - 1):
        assert stragglers.observe(SLOW_RANK_1) is None
    three = [(0.002, 0.007), (0.0073, 0.002), (0.0021, 0.007)]
    assert [stragglers.observe(three) for _ in range(WINDOW)][-1].startswith("rank 1 is a straggler")
    assert stragglers.observe([(0.009, 0.0)]) is None
