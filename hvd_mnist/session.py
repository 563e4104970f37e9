"""One process's session: Horovod and the device, the data, the run directory, then the training loop.

The one place that joins the two rooms: it makes the runtime's Supervisor and hands it to the training loop.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import horovod.tensorflow as hvd

from hvd_mnist.config import TrainConfig
from hvd_mnist.data.records import check_record_files, read_records
from hvd_mnist.data.sources import Dataset, hold_out_validation, load_dataset
from hvd_mnist.errors import UserError
from hvd_mnist.model_registry import MODELS
from hvd_mnist.runtime.boot.startup import phase_done
from hvd_mnist.runtime.storage.rundir import RunDir, prepare_run_dir
from hvd_mnist.runtime.supervisor import Supervisor
from hvd_mnist.runtime.world.distribution import World, on_chief, placement, setup_world
from hvd_mnist.train.loop import RunResult, TrainingLoop
from hvd_mnist.train.plan import BatchPlan
from hvd_mnist.train.telemetry.reporting import configure_logging
from hvd_mnist.train.user_model import build_model

log = logging.getLogger("hvd_mnist")
GLOO_MARGIN_S = 30


def load_data(config: TrainConfig) -> Dataset:
    """Examples in memory: TFRecord files when given, otherwise the chosen dataset; a validation split held
    out of the training examples when the run evaluates while it trains."""
    test = read_records(check_record_files(config.test_records)) if config.test_records else None
    if config.train_records:
        train_files = check_record_files(config.train_records)
        train = read_records(train_files)
        dataset = Dataset(train, test, f"{len(train)} examples in TFRecords {', '.join(train_files)}")
    else:
        dataset = load_dataset(config.dataset, config.data_dir)
        if test is not None:
            dataset = Dataset(dataset.train, test, dataset.description)
    if config.evaluates:
        dataset = hold_out_validation(dataset, config.validation_size, config.seed)
    return dataset


def run_session(config: TrainConfig) -> RunResult:
    """Validate, set up the world, and train; raises UserError for bad input, and RunEnded for every ending."""
    config.validate()
    if config.horovod_timeline:
        os.environ["HOROVOD_TIMELINE"] = "DYNAMIC"  # lets hvd.start_timeline write into the run directory
    if config.collective_timeout:
        # One knob: Gloo's own timeout (30 s unless horovodrun --gloo-timeout-seconds) would otherwise end
        # legitimate long gaps early and with no cause; the watchdog fires first and names one.
        os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(int(config.collective_timeout) + GLOO_MARGIN_S))
    supervisor = Supervisor(config.collective_timeout, config.elastic)
    with supervisor.ending():
        with supervisor.guarded(0, "starting Horovod"):
            world = setup_world(config.bind_cpus)
        phase_done("horovod_started")
        configure_logging(world)
        data = load_data(config)  # bad data fails on every rank before any file is written
        phase_done("data_loaded")
        if len(data.train) < world.size:
            raise UserError(f"{len(data.train)} training examples cannot be shared among {world.size} ranks")
        if config.model not in MODELS:  # a model of the user's that cannot be built is refused before any file
            build_model(config.model, seed=config.seed)
        activations = MODELS[config.model].activations if config.model in MODELS else 0  # unknown for a user's
        BatchPlan.of(config, world.size).check_fits(len(data.train), activations, *supervisor.memory_limit(world))
        run_dir = open_run_dir(config, world, supervisor)
        supervisor.run_dir_known(run_dir, world.is_chief)
        phase_done("run_dir_ready")
        with supervisor.guarded(0, "gathering the ranks' devices"):
            devices = placement(world, config.elastic)
        log.info("hvd_mnist: %d rank(s) over %s; %s", world.size, world.controller, devices)
        log.info("data: %s", data.description)
        if config.horovod_timeline:
            hvd.start_timeline(str(run_dir.timeline))  # only rank 0, Horovod's coordinator, writes it
        result = TrainingLoop(config, world, run_dir, data, supervisor).fit()
        if config.horovod_timeline:
            hvd.stop_timeline()
            log.info("Horovod timeline: %s (open it in https://ui.perfetto.dev or chrome://tracing)", run_dir.timeline)
    log.info("done: step %d, loss %.4f, test accuracy %s", result.final_step, result.final_loss,
             "n/a" if result.test_accuracy is None else f"{result.test_accuracy:.4f}")
    return result


def open_run_dir(config: TrainConfig, world: World, supervisor: Supervisor) -> RunDir:
    """Rank 0 prepares the run directory and every rank learns where it is (or rank 0's UserError)."""
    if config.elastic:
        # No collective before hvd.elastic.run: a worker joining later must not wait for one. The
        # directory is the explicit --output-dir, which a joiner of the same job finds already prepared.
        return prepare_run_dir(config) if world.is_chief else RunDir(Path(config.output_dir))
    with supervisor.guarded(0, "preparing the run directory"):
        return on_chief(world, lambda: prepare_run_dir(config), "run_dir")
