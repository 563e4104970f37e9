"""`hvd-mnist plot RUN_DIR`: a PNG of a run's loss, accuracy and learning rate, read from its metrics.jsonl.

Works on finished and running runs alike (a line still being written is skipped). matplotlib is needed by
this command only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hvd_mnist.errors import UserError
from hvd_mnist.runtime.storage.rundir import RunDir


def read_events(run_dir: RunDir) -> list[dict]:
    """The complete JSON lines of RUN_DIR/metrics.jsonl, in order."""
    path = run_dir.metrics
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise UserError(f"cannot read {path}: {err.strerror}") from None
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # the line a running job is writing now
    return events


def series(events: list[dict], kind: str, field: str) -> tuple[list[int], list[float]]:
    """(steps, values) of `field` in the events of one kind."""
    chosen = [e for e in events if e.get("event") == kind and e.get(field) is not None]
    return [e["step"] for e in chosen], [e[field] for e in chosen]


def plot(run_dir: RunDir, out: Path) -> Path:
    """Draw loss, train/validation accuracy (and the final test accuracy) and LR against steps into `out`."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("matplotlib is not installed (pip install matplotlib)") from None
    events = read_events(run_dir)
    if not (series(events, "train", "loss")[0] or series(events, "eval", "loss")[0]):
        raise UserError(f"no training progress in {run_dir.metrics} yet")
    figure, (loss_ax, accuracy_ax, lr_ax) = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    loss_ax.plot(*series(events, "train", "loss"), label="train (rank mean)")
    loss_ax.plot(*series(events, "eval", "loss"), "o-", label="validation")
    loss_ax.set_ylabel("loss")
    accuracy_ax.plot(*series(events, "train", "accuracy"), label="train batch")
    accuracy_ax.plot(*series(events, "eval", "accuracy"), "o-", label="validation (moving average)")
    test_steps, test_values = series(events, "end", "test_accuracy")
    if test_steps:
        accuracy_ax.plot(test_steps, test_values, "*", markersize=12, label=f"test {test_values[-1]:.4f}")
    for step in series(events, "target_reached", "accuracy")[0]:
        accuracy_ax.axvline(step, color="grey", linestyle=":", label=f"target reached at step {step}")
    accuracy_ax.set_ylabel("accuracy")
    lr_ax.plot(*series(events, "train", "lr"))
    lr_ax.set_ylabel("learning rate")
    lr_ax.set_xlabel("step")
    for ax in (loss_ax, accuracy_ax):
        ax.legend(loc="best", fontsize="small")
    for ax in (loss_ax, accuracy_ax, lr_ax):
        ax.grid(alpha=0.3)
    figure.suptitle(str(run_dir))
    figure.tight_layout()
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hvd-mnist plot", description=__doc__)
    parser.add_argument("run_dir", type=Path, help="a run directory (its metrics.jsonl is read)")
    parser.add_argument("--out", type=Path, help="PNG to write (default: RUN_DIR/metrics.png)")
    args = parser.parse_args(argv)
    run_dir = RunDir(args.run_dir)
    out = args.out or run_dir.plot
    try:
        path = plot(run_dir, out)
    except UserError as err:
        print(f"hvd-mnist plot: error: {err}", file=sys.stderr)
        return err.exit_code
    except OSError as err:
        print(f"hvd-mnist plot: error: cannot write {out}: {err.strerror}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
