"""The JSON-lines parser on what a real script prints: {"gpuvs": NAME, "value": N, "better": ..., "unit", "step"}."""

from __future__ import annotations

import json
import sys

import pytest

from gpuvs.workloads.command import outputs
from gpuvs.errors import UsageError
from job_output import run_and_read

SCRIPT = r"""
import json, sys
print("starting", flush=True)
print(json.dumps({"event": "config", "lr": 0.1}), flush=True)            # other JSON: not ours
for step in range(1, 6):
    line = {"gpuvs": "loss", "value": 1 / (step + 1), "step": step}
    if step == 1:
        line["better"] = "lower"
    print(json.dumps(line), flush=True)
    print(f"step {step} done", file=sys.stderr, flush=True)
print(json.dumps({"gpuvs": "samples_per_sec", "value": 5000.5, "unit": "samples/s", "better": "higher"}),
      file=sys.stderr, flush=True)
print(json.dumps({"gpuvs": "step_ms", "value": 12.5, "better": "lower", "kind": "time", "unit": "ms"}), flush=True)
"""


def test_a_script_printing_json_lines():
    reader = outputs.make_reader(["jsonl:loss,samples_per_sec"], headline="samples_per_sec")
    assert [m.name for m in reader.metrics] == ["wall_time_s"]  # nothing declared before the script names them
    run = run_and_read(reader, [sys.executable, "-c", SCRIPT])
    assert run.returncode == 0 and reader.failure() is None
    losses = run.named("loss")
    assert [(r.step, r.value) for r in losses] == [(s, 1 / (s + 1)) for s in range(1, 6)]
    assert [r.source for r in losses] == [f"stdout line {n}" for n in range(3, 8)]
    loss, rate = reader.metric("loss"), reader.metric("samples_per_sec")
    assert (loss.better, loss.per_step, loss.unit, loss.kind) == ("lower", True, "", "score")
    assert (rate.better, rate.per_step, rate.unit, rate.kind) == ("higher", False, "samples/s", "score")
    assert (reader.metric("step_ms").kind, reader.metric("step_ms").better) == ("time", "lower")
    assert run.one("samples_per_sec").value == 5000.5 and run.one("samples_per_sec").source.startswith("stderr")
    assert reader.headline == "samples_per_sec" and reader.last["samples_per_sec"].value == 5000.5


@pytest.mark.parametrize("lines, why", [
    ([{"gpuvs": "loss", "value": 0.5}], 'the first line of metric loss must say "better": "higher" or "lower"'),
    ([{"gpuvs": "loss", "value": 0.5, "better": "smaller"}], '"better" must be "higher" or "lower", not \'smaller\''),
    ([{"gpuvs": "loss", "value": "0.5", "better": "lower"}], '"value" must be a number'),
    ([{"gpuvs": "loss", "value": True, "better": "lower"}], '"value" must be a number'),
    ([{"gpuvs": "", "value": 1, "better": "lower"}], "metric: the name is empty"),
    ([{"gpuvs": "loss", "value": 1, "better": "lower", "step": -1}], '"step" must be a whole number >= 0'),
    ([{"gpuvs": "loss", "value": 1, "better": "lower"}, {"gpuvs": "loss", "value": 1, "better": "higher"}],
     'metric loss was declared "better": "lower" on its first line'),
    ([{"gpuvs": "loss", "value": 1, "better": "lower", "step": 1}, {"gpuvs": "loss", "value": 1}],
     "metric loss was first printed with a step"),
    ([{"gpuvs": "t", "value": 1, "better": "lower", "unit": "s"}, {"gpuvs": "t", "value": 1, "unit": "ms"}],
     "metric t was declared with unit 's' on its first line"),
    ([{"gpuvs": "t", "value": 1, "better": "lower", "kind": "rate"}], 'a "rate" is "better": "higher", not "lower"'),
    ([{"gpuvs": "t", "value": 1, "better": "lower", "kind": "speed"}], '"kind" must be one of'),
    ([{"gpuvs": "t", "value": 1, "better": "lower", "kind": "time"}, {"gpuvs": "t", "value": 1, "kind": "score"}],
     'metric t was declared "kind": "time" on its first line'),
    ([{"gpuvs": "wall_time_s", "value": 1, "better": "lower"}],
     "parser jsonl read metric wall_time_s (stdout line 1), which gpuvs (launch to exit) declares"),
])
def test_a_broken_metric_line_fails_the_trial_with_its_reason(lines, why):
    reader = outputs.make_reader(["jsonl"])
    script = "".join(f"print({json.dumps(json.dumps(obj))})\n" for obj in lines)
    run = run_and_read(reader, [sys.executable, "-c", script])
    assert run.returncode == 0
    failure = reader.failure()
    assert failure is not None and why in failure and failure.startswith(("JSON metric line (stdout line", "parser"))


def test_an_expected_metric_that_never_came_and_a_bad_expectation():
    reader = outputs.make_reader(["jsonl:loss,accuracy"])
    run_and_read(reader, [sys.executable, "-c", SCRIPT])
    failure = reader.failure()
    head = 'metric accuracy (a JSON line {"gpuvs": "accuracy", ...}) never appeared; last lines: '
    assert failure.startswith(head) and "loss" not in failure[:len(head)]
    shown = failure[len(head):].split(" | ")  # the last five lines to arrive, tagged with their stream
    # the two streams are read by two threads: which of them arrived last is the OS's (a loaded machine reorders
    # them), so the tail is checked as five of the script's own lines, each tagged with the stream it came on
    script_lines = {"stdout: starting", "stdout: " + json.dumps({"event": "config", "lr": 0.1}),
                    "stderr: " + json.dumps({"gpuvs": "samples_per_sec", "value": 5000.5, "unit": "samples/s",
                                             "better": "higher"}),
                    "stdout: " + json.dumps({"gpuvs": "step_ms", "value": 12.5, "better": "lower", "kind": "time",
                                             "unit": "ms"})}
    for step in range(1, 6):
        line = {"gpuvs": "loss", "value": 1 / (step + 1), "step": step}
        if step == 1:
            line["better"] = "lower"
        script_lines |= {"stdout: " + json.dumps(line), f"stderr: step {step} done"}
    assert len(shown) == 5 and set(shown) <= script_lines, shown
    with pytest.raises(UsageError, match=r"^parser jsonl:loss,,acc: metric: the name is empty"):
        outputs.make_reader(["jsonl:loss,,acc"])
