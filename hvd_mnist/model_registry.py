"""The built-in models, one record each, for the configuration, the CLI, build_model (train/user_model.py) and the
scaling plan: plain values that the plan reads without TensorFlow (tests/test_model.py checks them on the models)."""

from __future__ import annotations

from dataclasses import dataclass

from hvd_mnist.data.idx import IMAGE_SIDE, NUM_CLASSES, NUM_PIXELS


@dataclass(frozen=True)
class ModelRecord:
    """A built-in model: its builder (MODULE:CLASS, as --model names a user's) and what the scaling plan counts."""

    name: str
    label: str
    builder: str
    params: int
    gradient_tensors: int  # one per variable: what Horovod's tensor fusion packs into one message
    forward_macs: int  # multiply-adds per example (bias adds, ReLUs and pools left out)
    activations: int  # floats kept per example in a training step (each layer's output): BatchPlan.check_fits


S = IMAGE_SIDE  # LeNet-5: 5x5 convs with SAME padding and two 2x2 max pools, 28 -> 14 -> 7
MODELS = {record.name: record for record in (
    ModelRecord("mlp", "MLP 784-500-10", "hvd_mnist.train.model:MLP", 397_510, 4, NUM_PIXELS * 500 + 500 * NUM_CLASSES,
                activations=NUM_PIXELS + 2 * 500 + NUM_CLASSES),
    ModelRecord("lenet5", "LeNet-5", "hvd_mnist.train.model:LeNet5", 1_663_370, 8,
                S**2 * 32 * 25 + (S // 2) ** 2 * 64 * 800 + (S // 4) ** 2 * 64 * 512 + 512 * NUM_CLASSES,
                activations=NUM_PIXELS + 2 * S**2 * 32 + (S // 2) ** 2 * 32 + 2 * (S // 2) ** 2 * 64
                + (S // 4) ** 2 * 64 + 2 * 512 + NUM_CLASSES))}
