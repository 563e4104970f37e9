"""Your own model without editing hvd_mnist: a Keras 3 CNN defined in tests/user_models.py, named as
--model user_models:small_cnn, trains under 2 ranks to identical weights, resumes bit for bit and exports; a
factory that cannot be imported, fails, or gives the wrong shape is one line before any file is written."""

from __future__ import annotations

import pytest
import tensorflow as tf
from helpers import ROOT, end_weights, run_cli, run_trainer

pytestmark = pytest.mark.slow

USER_PATH = {"PYTHONPATH": str(ROOT / "tests")}  # where the user's package would be
RUN = ("--model", "user_models:small_cnn", "--steps", "40", "--checkpoint-every", "20", "--log-every", "10")


def test_a_keras_cnn_of_yours_trains_on_two_ranks_resumes_bit_for_bit_and_exports(tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    run_trainer("gloo", 2, *RUN, "--output-dir", str(whole), extra_env=USER_PATH)
    weights = end_weights(whole)
    assert len(weights) == 2 and len(set(weights)) == 1  # both ranks hold the same bytes
    served = tf.saved_model.load(str(whole / "export")).signatures["serving_default"]
    assert served(images=tf.zeros([3, 784]))["probabilities"].shape == (3, 10)

    killed = run_trainer("gloo", 2, *RUN, "--output-dir", str(cut), check=False,
                         extra_env={**USER_PATH, "HVD_MNIST_FAULT": "step:rank=1:step=25"})  # SIGKILL; ckpt-20
    assert killed.returncode != 0 and (cut / "checkpoints" / "ckpt-20.index").exists()
    run_trainer("gloo", 2, "--output-dir", str(cut), "--resume", extra_env=USER_PATH)
    assert end_weights(cut) == weights


@pytest.mark.parametrize(("spec", "expected"), [
    ("no_such_package.models:cnn", "--model no_such_package.models:cnn: cannot import no_such_package.models: "
                                   "ModuleNotFoundError"),
    ("user_models:no_such_function", "--model user_models:no_such_function: user_models has no function "
                                     "no_such_function"),
    ("user_models:broken", "--model user_models:broken: building it failed: RuntimeError: this factory always fails"),
    ("user_models:twelve_classes", "--model user_models:twelve_classes gives outputs of shape (2, 12) for 2 images; "
                                   "it must map [batch, 784] pixels to [batch, 10] logits"),
])
def test_a_model_that_cannot_serve_is_one_line_before_any_file(tmp_path, spec, expected, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", USER_PATH["PYTHONPATH"])
    proc = run_cli("--model", spec, "--output-dir", str(tmp_path / "run"))
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"hvd-mnist: error: {expected}"), \
        proc.stderr[-2000:]
    assert not (tmp_path / "run").exists()
