"""Wire one run together: Horovod and the device, the run directory, the data, then training."""

from __future__ import annotations

import logging
from pathlib import Path

from hvd_mnist.config import TrainConfig
from hvd_mnist.data.records import check_record_files, read_records
from hvd_mnist.data.sources import Split, load_dataset
from hvd_mnist.distribution import on_chief, setup_world
from hvd_mnist.errors import UserError
from hvd_mnist.reporting import configure_logging
from hvd_mnist.rundir import prepare_run_dir
from hvd_mnist.train import RunResult, train

log = logging.getLogger("hvd_mnist")


def resolve_sources(config: TrainConfig) -> tuple[Split, Split | None, str]:
    """Training and test examples in memory: from TFRecord files when given, otherwise the chosen dataset."""
    test_split = read_records(check_record_files(config.test_records)) if config.test_records else None
    if config.train_records:
        train_files = check_record_files(config.train_records)
        train_split = read_records(train_files)
        return train_split, test_split, f"{len(train_split)} examples in TFRecords {', '.join(train_files)}"
    dataset = load_dataset(config.dataset, config.data_dir)
    return dataset.train, test_split or dataset.test, dataset.description


def run(config: TrainConfig) -> RunResult:
    """Validate, set up the world, and train; raises UserError for bad input."""
    config.validate()
    world = setup_world(config.bind_cpus)
    configure_logging(world)
    train_source, test_source, description = resolve_sources(config)  # bad data fails before any file is written
    if len(train_source) < world.size:
        raise UserError(f"{len(train_source)} training examples cannot be shared among {world.size} ranks")
    if config.elastic:
        # No collective before hvd.elastic.run: a worker joining later must not wait for one. The
        # directory is the explicit --output-dir, which a joiner of the same job finds already prepared.
        run_dir = prepare_run_dir(config) if world.is_chief else Path(config.output_dir)
    else:
        run_dir = on_chief(world, lambda: prepare_run_dir(config), "run_dir")
    global_batch = config.batch_size * world.size
    log.info("hvd_mnist: %d rank(s) over %s, this rank on %s", world.size, world.controller, world.device)
    log.info("data: %s", description)
    log.info("model %s, batch %d per rank (global %d), %d steps, output in %s",
             config.model, config.batch_size, global_batch, config.steps, run_dir)
    result = train(config, world, run_dir, train_source, test_source)
    log.info("done: step %d, loss %.4f, test accuracy %s", result.final_step, result.final_loss,
             "n/a" if result.test_accuracy is None else f"{result.test_accuracy:.4f}")
    return result
