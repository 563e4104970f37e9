"""hvd_mnist.keras with real processes: Keras 3 `fit` on two ranks trains as one (and Horovod's own Keras
DistributedOptimizer, the trap, does not)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from helpers import ROOT, TIMEOUT, launch_argv, launcher_env

pytestmark = pytest.mark.slow

PROBE = ROOT / "tests" / "keras_probe.py"
# 1 rank at batch 32 against 2 at batch 16, SGD, 2 epochs: the weights differed by at most 9e-8 (2026-12-07):
# the same arithmetic but for the order of the sums over the batch.
EQUIVALENCE_ATOL = 1e-5


def fit(out, launcher: str = "gloo", ranks: int = 2, *args: str) -> subprocess.CompletedProcess:
    """Run tests/keras_probe.py on `ranks` ranks, writing into `out`."""
    out.mkdir(exist_ok=True)
    argv = launch_argv(launcher, ranks, sys.executable, str(PROBE), "--out", str(out), *args)
    return subprocess.run(argv, env=launcher_env(), capture_output=True, text=True, timeout=TIMEOUT)


def ended(out, ranks: int = 2, *args: str, launcher: str = "gloo") -> list[dict[str, np.ndarray]]:
    """Each rank's weights, optimizer variables and logs after a probe run that must succeed."""
    proc = fit(out, launcher, ranks, *args)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return [dict(np.load(out / f"rank{rank}.npz")) for rank in range(ranks)]


def arrays(state: dict[str, np.ndarray], prefix: str) -> list[np.ndarray]:
    return [state[name] for name in sorted(state, key=lambda n: (len(n), n)) if name.startswith(prefix)]


@pytest.mark.parametrize(("optimizer", "launcher"), [("sgd", "gloo"), ("adam", "gloo"), ("sgd", "mpirun"),
                                                     ("adam", "mpirun")])
def test_fit_ends_with_identical_weights_slots_and_logs(tmp_path, optimizer, launcher):
    rank0, rank1 = ended(tmp_path, 2, "--optimizer", optimizer, launcher=launcher)
    assert len(arrays(rank0, "weight")) == 4
    assert len(arrays(rank0, "optimizer")) >= (10 if optimizer == "adam" else 6)  # Adam: 2 slots a variable
    for name in rank0:
        if name != "logs":
            np.testing.assert_array_equal(rank1[name], rank0[name], err_msg=name)
    logs = json.loads(str(rank0["logs"]))
    assert logs == json.loads(str(rank1["logs"]))  # MetricAverageCallback: both ranks saw the same numbers
    assert logs["loss"][-1] < logs["loss"][0]


def test_batchnorm_statistics_end_equal_on_every_rank(tmp_path):
    """BatchNormalization's moving mean and variance follow each rank's own shard; the broadcast callback
    averages them at each epoch's end, so the ranks end equal (weights 0-1 and 6-7 dense, 2-5 the norm's)."""
    rank0, rank1 = ended(tmp_path, 2, "--batchnorm")
    assert len(arrays(rank0, "weight")) == 8
    for name in rank0:
        if name != "logs":
            np.testing.assert_array_equal(rank1[name], rank0[name], err_msg=name)


def test_two_ranks_equal_one_rank_with_twice_the_batch(tmp_path):
    (two,) = ended(tmp_path / "np2", 2, "--batch-size", "16")[:1]
    (one,) = ended(tmp_path / "np1", 1, "--batch-size", "32", launcher="python")
    for got, want in zip(arrays(two, "weight"), arrays(one, "weight"), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=EQUIVALENCE_ATOL)
    assert not np.array_equal(arrays(two, "weight")[0], arrays(ended(tmp_path / "b16", 1, "--batch-size", "16",
                                                                     launcher="python")[0], "weight")[0])


def test_a_resumed_fit_ends_where_an_uninterrupted_one_does(tmp_path):
    """One epoch, then a second launch resumed from rank 0's model.keras (optimizer included) for the second."""
    ended(tmp_path / "split", 2, "--optimizer", "adam", "--epochs", "1")
    resumed = ended(tmp_path / "split", 2, "--optimizer", "adam", "--epochs", "2", "--resume")
    whole = ended(tmp_path / "whole", 2, "--optimizer", "adam", "--epochs", "2")
    for name in whole[0]:
        if name != "logs":
            np.testing.assert_array_equal(resumed[0][name], whole[0][name], err_msg=name)
            np.testing.assert_array_equal(resumed[1][name], whole[0][name], err_msg=name)


def test_the_trap_horovods_keras_optimizer_leaves_the_ranks_apart(tmp_path):
    """Horovod 0.28's DistributedOptimizer on a Keras 3 optimizer applies each rank's own gradient, silently."""
    horovod = ended(tmp_path / "horovod", 2, "--wrapper", "horovod")
    assert not np.array_equal(horovod[0]["weight0"], horovod[1]["weight0"])
    ours = ended(tmp_path / "ours", 2, "--wrapper", "hvd_mnist")
    np.testing.assert_array_equal(ours[0]["weight0"], ours[1]["weight0"])


def test_jit_compile_is_refused_in_one_line(tmp_path):
    proc = fit(tmp_path, "python", 1, "--jit-compile")
    assert proc.returncode != 0
    assert "XLA cannot compile Horovod's allreduce: compile the model with jit_compile=False" in proc.stderr


def test_sync_batch_normalization_normalizes_the_global_batch(tmp_path):
    """Two ranks, each with half of a batch, normalize as Keras's BatchNormalization does the whole batch (its
    outputs for their rows and the moving statistics); each half alone would give other numbers."""
    argv = launch_argv("gloo", 2, sys.executable, str(ROOT / "tests" / "syncbn_probe.py"), str(tmp_path))
    proc = subprocess.run(argv, env=launcher_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    for rank in (0, 1):
        got = np.load(tmp_path / f"syncbn{rank}.npz")
        np.testing.assert_allclose(got["synced"], got["plain"][got["rows"]], atol=1e-5)
        for stat in ("mean", "variance"):
            np.testing.assert_allclose(got[f"synced_{stat}"], got[f"plain_{stat}"], atol=1e-5)
        assert not np.allclose(got["synced"], got["alone"], atol=1e-3)  # what an unsynchronized rank computes
