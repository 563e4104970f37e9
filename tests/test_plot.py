"""`hvd-mnist plot RUN_DIR`: a PNG from metrics.jsonl, also while a run is still writing it; one-line errors."""

from __future__ import annotations

import json
import sys

from hvd_mnist.plot import main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_metrics(run_dir, torn_tail: bool = False) -> None:
    run_dir.mkdir()
    events = [{"event": "start", "start_step": 0}]
    events += [{"event": "train", "step": s, "loss": 1 / s, "accuracy": 1 - 1 / s, "lr": 0.1} for s in (10, 20, 30)]
    events += [{"event": "eval", "step": 20, "accuracy": 0.8, "loss": 0.5},
               {"event": "target_reached", "step": 20, "accuracy": 0.8},
               {"event": "end", "step": 30, "test_accuracy": 0.79}]
    text = "".join(json.dumps(e) + "\n" for e in events)
    (run_dir / "metrics.jsonl").write_text(text + ('{"event": "train", "st' if torn_tail else ""))


def test_plot_of_a_run_being_written(tmp_path, capsys):
    run_dir = tmp_path / "run"
    write_metrics(run_dir, torn_tail=True)
    assert main([str(run_dir)]) == 0
    assert capsys.readouterr().out.strip() == str(run_dir / "metrics.png")
    assert (run_dir / "metrics.png").read_bytes()[:8] == PNG_SIGNATURE
    assert main([str(run_dir), "--out", str(tmp_path / "other.png")]) == 0
    assert (tmp_path / "other.png").read_bytes()[:8] == PNG_SIGNATURE


def test_one_line_errors(tmp_path, capsys, monkeypatch):
    assert main([str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err == f"hvd-mnist plot: error: cannot read {tmp_path}/missing/metrics.jsonl: " \
                                      "No such file or directory\n"
    run_dir = tmp_path / "run"
    write_metrics(run_dir)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    assert main([str(run_dir)]) == 2
    assert capsys.readouterr().err == "hvd-mnist plot: error: matplotlib is not installed (pip install matplotlib)\n"
