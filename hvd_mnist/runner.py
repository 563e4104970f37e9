"""Wire one run together: Horovod and the device, the run directory, the data, then training."""

from __future__ import annotations

import logging
from pathlib import Path

from hvd_mnist.config import TrainConfig
from hvd_mnist.data.pipeline import Source
from hvd_mnist.data.records import check_record_files, validate_records
from hvd_mnist.data.sources import load_dataset
from hvd_mnist.distribution import World, on_chief, setup_world
from hvd_mnist.rundir import prepare_run_dir
from hvd_mnist.train import RunResult, train

log = logging.getLogger("hvd_mnist")


def configure_logging(world: World) -> None:
    """Rank 0 logs progress; the other ranks log warnings and errors only, tagged with their rank.

    TensorFlow's own Python logger is held to errors, so the console shows the run, not the library.
    """
    tag = "" if world.is_chief else f"[rank {world.rank}] "
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s {tag}%(message)s", datefmt="%H:%M:%S"))
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.INFO if world.is_chief else logging.WARNING)
    logging.getLogger("tensorflow").setLevel(logging.ERROR)


def resolve_sources(config: TrainConfig) -> tuple[Source, Source | None, str]:
    """Training and test examples: TFRecord files when given, otherwise the chosen dataset in memory."""
    test_files = check_record_files(config.test_records) if config.test_records else None
    if test_files:
        validate_records(test_files)
    if config.train_records:
        train_files = check_record_files(config.train_records)
        count = validate_records(train_files)
        return train_files, test_files, f"{count} examples in TFRecords {', '.join(train_files)}"
    dataset = load_dataset(config.dataset, config.data_dir)
    return dataset.train, test_files or dataset.test, dataset.description


def run(config: TrainConfig) -> RunResult:
    """Validate, set up the world, and train; raises UserError for bad input."""
    config.validate()
    world = setup_world()
    configure_logging(world)
    train_source, test_source, description = resolve_sources(config)  # bad data fails before any file is written
    run_dir: Path = on_chief(world, lambda: prepare_run_dir(config), "run_dir")
    global_batch = config.batch_size * world.size
    log.info("hvd_mnist: %d rank(s) over %s, this rank on %s", world.size, world.controller, world.device)
    log.info("data: %s", description)
    log.info("model %s, batch %d per rank (global %d), %d steps, output in %s",
             config.model, config.batch_size, global_batch, config.steps, run_dir)
    result = train(config, world, run_dir, train_source, test_source)
    log.info("done: step %d, loss %.4f, test accuracy %s", result.final_step, result.final_loss,
             "n/a" if result.test_accuracy is None else f"{result.test_accuracy:.4f}")
    return result
