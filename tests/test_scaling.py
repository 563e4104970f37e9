"""Real links between hosts, shaped (scripts/bench/netns.py): three hosts, each link held to 100 Mbit/s by tbf,
and the gradient's allreduce, float32 and fp16, against the ring model at the links' nominal rate. The link, not
the machine's cores, sets these times (about 0.17 s a call against milliseconds unshaped), so the check holds on a
loaded machine. The model's own arithmetic and fit are checked without a network."""

from __future__ import annotations

import subprocess

import pytest
from helpers import started

from scripts.bench.scaling import fit_alpha_bandwidth, ring_allreduce_seconds
from scripts.bench.shaped import allreduce, nominal, shaped_hosts

RATE_MBIT = 100


def test_the_ring_model_and_its_fit():
    """2(N-1)/N S/B + 2(N-1) alpha, and alpha and B recovered from times it made."""
    size, bandwidth, alpha = 1_590_040, 12.5e6, 40e-6
    assert ring_allreduce_seconds(1, size, bandwidth, alpha) == 0
    assert ring_allreduce_seconds(2, size, bandwidth, alpha) == pytest.approx(size / bandwidth + 2 * alpha)
    samples = [(n, size, ring_allreduce_seconds(n, size, bandwidth, alpha)) for n in (2, 3, 4)]
    fitted_alpha, fitted_bandwidth = fit_alpha_bandwidth(samples)
    assert fitted_alpha == pytest.approx(alpha, rel=1e-6) and fitted_bandwidth == pytest.approx(bandwidth, rel=1e-6)
    with pytest.raises(ValueError):
        fit_alpha_bandwidth(samples[:1])


@pytest.mark.slow
def test_three_hosts_on_shaped_links_allreduce_as_the_model_predicts(tmp_path):
    with started(shaped_hosts(3, tmp_path, RATE_MBIT), "shaped links between namespaces") as hosts:
        full = allreduce(hosts, "gloo", RATE_MBIT, False, tmp_path, timeout=300)
        half = allreduce(hosts, "gloo", RATE_MBIT, True, tmp_path, timeout=300)
    assert nominal(3, RATE_MBIT) / full - 1 == pytest.approx(0, abs=0.25), f"{full:.3f} s a call"
    assert nominal(3, RATE_MBIT, fp16=True) / half - 1 == pytest.approx(0, abs=0.25), f"{half:.3f} s a call (fp16)"
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert hosts.prefix not in left
