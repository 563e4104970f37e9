"""Launch to exit in phases, alike for every racer: where a launch's fixed costs go.

Each racer's rank 0 leaves marks in seconds since its process started (hvd_mnist in metrics.jsonl, the peers in
result.json through common.PHASES) and when that process started; the benchmark knows when it launched the job
and when the job ended. The phases are the spans between them, with validation while training taken out of
training and shown on its own. A phase a racer does not have (a peer exports nothing) is None.
"""

from __future__ import annotations

# The marks in order, each ending the phase named beside it; the launcher's phase ends at the process's start.
MARKS = (("interpreter", "interpreter"), ("framework_imported", "framework_import"),
         ("rendezvous_done", "rendezvous"), ("data_ready", "data"), ("first_step", "first_step"),
         ("trained", "training"), ("tested", "test"), ("exported", "export"))
PHASES = ("launcher", *(phase for _, phase in MARKS[:6]), "evaluation", *(phase for _, phase in MARKS[6:]), "exit")
LABELS = {"launcher": "launcher", "interpreter": "interpreter", "framework_import": "framework import",
          "rendezvous": "rendezvous", "data": "data + model", "first_step": "first step", "training": "training",
          "evaluation": "validation", "test": "test", "export": "export", "exit": "exit"}
# hvd_mnist's own phase names (runtime/startup.phase_done) for the marks: "restored" ends reading the data,
# preparing the run directory and the first broadcast; "first_call" is the first compiled step.
HVD_MNIST_MARKS = {"python_and_flags": "interpreter", "tensorflow_imported": "framework_imported",
                   "horovod_started": "rendezvous_done", "restored": "data_ready", "first_call": "first_step",
                   "trained": "trained", "tested": "tested", "exported": "exported"}


def durations(launched_at: float, wall_s: float, started_at: float, marks: dict[str, float],
              evaluation_s: float = 0.0) -> dict[str, float | None]:
    """Seconds per phase from launch to exit: they add up to wall_s (the launcher's share may be negative by a
    clock tick: the process start time is kept in hundredths of a second)."""
    spans: dict[str, float | None] = {"launcher": started_at - launched_at}
    previous = 0.0
    for mark, phase in MARKS:
        if mark in marks:
            spans[phase], previous = marks[mark] - previous, marks[mark]
        else:
            spans[phase] = None
    if spans["training"] is not None:
        spans["training"] -= evaluation_s
    spans["evaluation"] = evaluation_s
    spans["exit"] = launched_at + wall_s - (started_at + previous)
    return {phase: None if spans[phase] is None else round(spans[phase], 3) for phase in PHASES}


def table(phases_by_racer: dict[str, dict[str, float | None]]) -> str:
    """The racers' phases side by side, one row per phase, in seconds."""
    racers = list(phases_by_racer)
    lines = [f"{'launch to exit, s':<20}" + "".join(f"{racer:>18}" for racer in racers)]
    for phase in (*PHASES, "total"):
        cells = []
        for racer in racers:
            spans = phases_by_racer[racer]
            value = sum(v for v in spans.values() if v is not None) if phase == "total" else spans.get(phase)
            cells.append(f"{'-' if value is None else format(value, '.2f'):>18}")
        lines.append(f"{LABELS.get(phase, phase):<20}" + "".join(cells))
    return "\n".join(lines)
