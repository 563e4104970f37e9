"""One rank of tests/test_keras.py's SyncBatchNormalization check: each rank normalizes its half of one fixed
batch with hvd_mnist.keras.SyncBatchNormalization (training mode) and saves its output and moving statistics,
and Keras's own BatchNormalization's on the whole batch, to OUT/syncbn<R>.npz."""

from __future__ import annotations

import sys
from pathlib import Path

import keras
import numpy as np

import hvd_mnist.keras as hvd

hvd.init()
batch = np.random.default_rng(0).normal(2.0, 3.0, size=(8, 5)).astype("float32")
mine = batch[hvd.rank()::hvd.size()]
synced, plain = hvd.SyncBatchNormalization(momentum=0.5), keras.layers.BatchNormalization(momentum=0.5)
np.savez(Path(sys.argv[1]) / f"syncbn{hvd.rank()}.npz", rows=np.arange(8)[hvd.rank()::hvd.size()],
         synced=synced(mine, training=True).numpy(), plain=plain(batch, training=True).numpy(),
         alone=keras.layers.BatchNormalization()(mine, training=True).numpy(),
         synced_mean=synced.moving_mean.numpy(), plain_mean=plain.moving_mean.numpy(),
         synced_variance=synced.moving_variance.numpy(), plain_variance=plain.moving_variance.numpy())
