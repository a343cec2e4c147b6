"""gpuvs compare and gpuvs report as a user runs them: real worker processes, a real SQLite store,
real headless Chromium for the HTML report."""

import json
import os
import signal
import re
import sqlite3
import subprocess
import sys
import time

import pytest

from conftest import gpuvs_env, gpuvs_processes, pid_alive
from report_browser import chromium_dom, chromium_screenshot, distinct_colours, pixels_of

# 20x apart: settled however loaded this shared machine is (sleeps of 1 ms vary by half under load)
FAST_SLOW = ["selftest", "--device", "cpu", "--steps", "4", "--arm", "fast:step_seconds=0.005", "--arm", "slow:step_seconds=0.1",
             "--order-seed", "5", "--quiet"]


def workers_left(tmp_path) -> list[int]:
    """Live gpuvs workers started from this test's folder (other people's tests run on this machine too)."""
    out = []
    for pid in gpuvs_processes():
        try:
            if os.readlink(f"/proc/{pid}/cwd").startswith(str(tmp_path)):
                out.append(pid)
        except OSError:
            pass
    return out


def exp_id(stdout: str) -> str:
    line = [ln for ln in stdout.splitlines() if ln.startswith("experiment ")][-1]
    return line.split()[1]


def test_an_aa_run_compares_a_setup_with_itself(cli, tmp_path):
    """--aa alone: two arms, a and b, that run exactly alike, interleaved as any comparison (the standard check
    of a measuring setup); the same from a file's aa: true, whose arms may then be alike."""
    r = cli("compare", "selftest", "--device", "cpu", "--steps", "3", "--step-seconds", "0.005", "--aa", "--trials",
            "2", "--quiet", "--order-seed", "3")
    assert r.returncode == 0, r.stderr
    assert "Verdict: each arm against a" in r.stdout
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    (name, meta), = db.execute("SELECT name, meta FROM experiments").fetchall()
    assert name == "selftest: a vs b (A/A)"
    assert [(a["name"], a["overrides"]) for a in json.loads(meta)["arms"]] == [("a", {}), ("b", {})]
    rows = db.execute("SELECT arm, status FROM trials ORDER BY id").fetchall()
    assert sorted(rows) == [("a", "ok"), ("a", "ok"), ("b", "ok"), ("b", "ok")]
    (tmp_path / "aa.yaml").write_text("workload: selftest\ndevice: cpu\nparams: {steps: 3, step_seconds: 0.005}\n"
                                      "trials: 2\naa: true\narms: [{name: x}, {name: y}]\n")
    r = cli("compare", "--file", "aa.yaml", "--quiet")
    assert r.returncode == 0, r.stderr
    assert "Verdict: each arm against x" in r.stdout
    assert workers_left(tmp_path) == []


def test_compare_selftest_then_report_in_every_format(cli, tmp_path):
    r = cli("compare", *FAST_SLOW, "--trials", "3")
    assert r.returncode == 0, r.stderr
    ident = exp_id(r.stdout)
    assert "Verdict: each arm against fast" in r.stdout and "slow is " in r.stdout and "% slower than fast [" in r.stdout
    assert "trial 6 of 6" in r.stdout  # the progress bar's last state
    rows = sqlite3.connect(tmp_path / "gpuvs.db").execute(
        "SELECT arm, trial, status FROM trials ORDER BY id").fetchall()
    arms = [a for a, _, _ in rows]
    assert len(rows) == 6 and {s for _, _, s in rows} == {"ok"}
    assert arms[2:4] == arms[:2][::-1] and set(arms[:2]) == set(arms[4:]) == {"fast", "slow"}  # A B | B A | ...
    meta = json.loads(sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT meta FROM experiments").fetchone()[0])
    assert meta["margin"] == 0.02 and meta["command"].startswith("gpuvs compare selftest --device cpu --steps 4")

    r = cli("report", ident[:15], "--format", "json")
    data = json.loads(r.stdout)
    (v,) = data["verdicts"]
    assert v["arm"] == "slow" and v["baseline"] == "fast" and v["verdict"] == "slower" and v["unit"] == "steps/sec"
    assert v["ratio"] < 0.2 and v["ci_low"] < v["ratio"] < v["ci_high"] and v["method"] == "paired"
    fast = [a for a in data["arms"] if a["name"] == "fast"][0]
    assert fast["n_ok"] == 3 and len(fast["values"]["main"]) == 3

    r = cli("report", ident, "--format", "md")
    assert r.returncode == 0 and "| main (steps/sec) | slow |" in r.stdout and "| slower |" in r.stdout
    assert "| test case | fast steps/sec | slow steps/sec |" in r.stdout
    r = cli("report", ident, "--format", "csv")
    assert r.returncode == 0 and len(r.stdout.strip().splitlines()) == 7
    r = cli("report", ident)
    assert r.returncode == 0 and "Verdict" in r.stdout and "Where each arm ran" in r.stdout
    r = cli("report", ident, "--format", "term", "-o", "r.txt")
    assert r.returncode == 0 and "Verdict" in (tmp_path / "r.txt").read_text()
    run_id = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT run_id FROM trials").fetchone()[0]
    r = cli("report", run_id, "--format", "json")  # a trial's run id names its experiment
    assert r.returncode == 0 and json.loads(r.stdout)["id"] == ident
    r = cli("report", ident, "--format", "pdf")
    assert r.returncode == 2 and "--format: 'pdf' is not allowed" in r.stderr
    r = cli("report", "nosuch")
    assert r.returncode == 2 and "no experiment 'nosuch'" in r.stderr
    assert workers_left(tmp_path) == []


def test_until_confident_adds_pairs_until_settled_or_the_cap(cli, tmp_path):
    # a 20x difference is settled long before the cap: it stops there
    r = cli("compare", *FAST_SLOW, "--trials", "2", "--until-confident", "--max-trials", "8", "--name", "settled")
    assert r.returncode == 0, r.stderr
    settled = [ln for ln in r.stdout.splitlines() if ln.startswith("until-confident: settled after ")]
    assert len(settled) == 1, r.stdout
    per_arm = int(settled[0].split()[3])
    assert per_arm in (2, 4, 6)
    # arms that run the same cannot be settled at 99.9% with a 0.1% margin in 4 trials: pairs are
    # added (A B | B A) up to the cap
    r = cli("compare", "selftest", "--device", "cpu", "--steps", "3", "--step-seconds", "0.001", "--arm", "a:text=x",
            "--arm", "b:text=y",
            "--trials", "2", "--until-confident", "--max-trials", "4", "--confidence", "0.999", "--margin", "0.001",
            "--quiet", "--name", "capped")
    assert r.returncode == 0, r.stderr
    assert "adding 2 per arm" in r.stdout and "not settled after 4 trials per arm (--max-trials 4)" in r.stdout
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    counts = dict(db.execute("SELECT e.name, COUNT(t.id) FROM experiments e JOIN trials t ON t.experiment_id=e.id "
                             "GROUP BY e.name").fetchall())
    assert counts == {"settled": 2 * per_arm, "capped": 8}
    arms = [a for (a,) in db.execute("SELECT t.arm FROM trials t JOIN experiments e ON e.id=t.experiment_id "
                                     "WHERE e.name='capped' ORDER BY t.id")]
    assert arms[2:4] == arms[0:2][::-1] and arms[6:8] == arms[4:6][::-1]  # every added pair is balanced too
    assert workers_left(tmp_path) == []


@pytest.mark.parametrize("args, message", [
    (["compare", "selftest", "--device", "cpu", "--arm", "a:steps=2"], "gpuvs compare needs two or more --arm "
     "NAME:key=value[,key=value...], got 1; to compare a setup with itself (an A/A run), --aa alone"),
    (["compare", "selftest", "--device", "cpu", "--arm", "a:steps=2", "--arm", "b:steps=2"],
     "--arm #2: arm 'b' runs exactly as arm 'a' (at --arm #1): arms must differ in something; to compare a setup "
     "with itself (an A/A run) pass --aa"),
    (["compare", "selftest", "--device", "cpu", "--aa", "--arm", "a:steps=2", "--arm", "b:steps=3"],
     "--arm #2: arm 'b' does not run as arm 'a' (at --arm #1): an A/A run compares a setup with itself, its arms "
     "alike; to compare arms that differ, leave out --aa"),
    (["compare", "selftest", "--device", "cpu", "--arm", "a:steps=2,steps=3", "--arm", "b:steps=3"],
     "--arm 'a:steps=2,steps=3': key 'steps' is given twice; give each key once"),
    (["compare", "selftest", "--device", "cpu", "--arm", "a", "--arm", "b:steps=3", "--trails", "2"],
     "unknown option --trails for gpuvs compare selftest (did you mean '--trials'?); gpuvs compare selftest --help "
     "lists its options"),
    # a command's own options without the -- before them: say where the command goes, with the user's words
    (["compare", "command", "--device", "cpu", "--arm", "a:timeout=50", "--arm", "b:timeout=60", "python3", "x.py",
      "--epochs", "1"], "unknown option --epochs for gpuvs compare command: put the command after --, e.g. gpuvs "
     "compare command --device cpu --arm a:timeout=50 --arm b:timeout=60 -- python3 x.py --epochs 1"),
    (["compare", "selftest", "--device", "cpu", "--arm", "a:stepz=2", "--arm", "b:steps=3"],
     "unknown key 'stepz' (did you mean 'steps'?)"),
    (["compare", "selftest", "--device", "cpu", "--arm", "a:steps=0", "--arm", "b:steps=3"],
     "--steps: '0' is not allowed"),
    (["compare", "selftest", "--arm", "a", "--arm", "b:device=cuda"], "arm b: device cuda asked for, but this machine"),
    (["compare", "selftest", "--device", "cpu", "--arm", "a", "--arm", "b:steps=3", "--max-trials", "5"],
     "--max-trials applies with"),
    (["compare", "selftest", "--device", "cpu", "--arm", "a", "--arm", "b:steps=3", "--margin", "-1"],
     "--margin: '-1' is not allowed"),
    (["compare", "--file", "nope.yaml"], "experiment file nope.yaml not found"),
    (["compare", "--file", "bad.yaml"], "bad.yaml:4: unknown key 'colour'"),
    (["compare", "--file", "ok.yaml", "--arm", "c:steps=2"], "--arm cannot be combined with --file"),
    (["compare", "--file", "ok.yaml", "--stepz", "2"],
     "unknown option --stepz for gpuvs compare --file (did you mean '--steps'?)"),
    (["compare", "--file", "ok.yaml", "--aa"], "ok.yaml:3: arm 'b' does not run as arm 'a' (at ok.yaml:3): an A/A "
     "run compares a setup with itself, its arms alike; to compare arms that differ, leave out aa: true"),
    (["report", "x"], "no store at gpuvs.db"),
    (["compare", "selftest", "--device", "cpu", *[f"--arm=a{i}:steps={i + 1}" for i in range(257)]],
     "--arm #257: 257 arms given; a comparison takes at most 256 (split a larger sweep into several comparisons)"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_started(cli, tmp_path, args, message):
    (tmp_path / "bad.yaml").write_text("workload: selftest\ndevice: cpu\narms: [{name: a}, {name: b, steps: 2}]\n"
                                       "colour: red\n")
    (tmp_path / "ok.yaml").write_text("workload: selftest\ndevice: cpu\narms: [{name: a}, {name: b, steps: 2}]\n")
    r = cli(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("gpuvs: error:")]
    assert len(errors) == 1 and message in errors[0], r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert not (tmp_path / "gpuvs.db").exists()
    assert workers_left(tmp_path) == []


def test_file_compare_with_command_line_overrides(cli, tmp_path):
    (tmp_path / "exp.yaml").write_text("name: from-file\nworkload: selftest\nparams: {steps: 50}\ndevice: cpu\n"
                                       "trials: 9\narms:\n  - {name: a}\n  - {name: b, step_seconds: 0.002}\n")
    r = cli("compare", "--file", "exp.yaml", "--trials", "1", "--steps", "2", "--step-seconds", "0.001",
            "--store", "other.db", "--quiet")
    assert r.returncode == 0, r.stderr
    db = sqlite3.connect(tmp_path / "other.db")
    rows = db.execute("SELECT arm, spec FROM trials ORDER BY arm").fetchall()
    specs = {arm: json.loads(spec) for arm, spec in rows}
    assert set(specs) == {"a", "b"}  # one trial per arm, not the file's nine
    assert specs["a"]["params"]["steps"] == 2 and specs["a"]["params"]["step_seconds"] == 0.001
    assert specs["b"]["params"]["step_seconds"] == 0.002  # the arm still applies on top
    assert db.execute("SELECT COUNT(*) FROM samples").fetchone()[0] == 4
    assert ("can't tell yet whether b differs from a on steps/sec: 2 or more successful trials per arm are needed "
            "(1 more)") in r.stdout


def test_failed_trials_exit_1_and_the_report_lists_them(cli, tmp_path):
    r = cli("compare", "selftest", "--device", "cpu", "--steps", "3", "--arm", "ok", "--arm", "broken:fail_at_step=2",
            "--trials", "1", "--quiet")
    assert r.returncode == 1 and "1 of 2 trial(s) failed" in r.stderr
    r = cli("report", exp_id(r.stdout), "--format", "md")
    assert "### Trials that did not finish" in r.stdout and "selftest failed at step 2 as asked" in r.stdout
    assert "an arm has no successful trial" in r.stdout


def test_ctrl_c_during_compare_stops_everything(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "gpuvs", "compare", "selftest", "--device", "cpu", "--steps", "8", "--step-seconds",
                             "0.25", "--arm", "a", "--arm", "b:text=x", "--trials", "4", "--children", "1"],
                            cwd=tmp_path, env=gpuvs_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    db = tmp_path / "gpuvs.db"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if db.exists() and sqlite3.connect(db).execute("SELECT COUNT(*) FROM trials").fetchone()[0] >= 2:
                break
        except sqlite3.OperationalError:
            pass
        time.sleep(0.2)
    time.sleep(0.8)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    statuses = [s for (s,) in sqlite3.connect(db).execute("SELECT status FROM trials ORDER BY id")]
    assert statuses[0] == "ok" and statuses[-1] == "interrupted"
    time.sleep(0.5)
    assert workers_left(tmp_path) == []
    kids = [int(p) for line in out.splitlines() if line.startswith("children ") for p in line.split()[1:]]
    assert kids and not any(pid_alive(p) for p in kids)  # the children of the interrupted worker too


def test_cnn_train_nchw_vs_nhwc_on_cpu_with_markdown_and_html_reports(cli, tmp_path):
    r = cli("compare", "cnn-train", "--device", "cpu", "--model", "resnet18", "--batch-size", "2", "--image-size",
            "32", "--steps", "3", "--warmup-steps", "1", "--arm", "nchw:data_format=NCHW", "--arm",
            "nhwc:data_format=NHWC", "--trials", "2", "--order-seed", "1", "--quiet", timeout=300)
    assert r.returncode == 0, r.stderr
    ident = exp_id(r.stdout)
    r = cli("report", ident, "--format", "md", "-o", "report.md")
    md = (tmp_path / "report.md").read_text()
    assert r.returncode == 0 and "| main (images/sec) | nhwc |" in md and "| test case | nchw images/sec |" in md
    assert "| CUDA (torch) |" in md or "| torch |" in md  # fingerprints side by side
    r = cli("report", ident, "--format", "html", "-o", "report.html")
    assert r.returncode == 0, r.stderr
    html = tmp_path / "report.html"
    dom = chromium_dom(html, tmp_path)
    assert 'id="verdicts"' in dom and ">nhwc<" in dom and "images/sec" in dom
    assert dom.count("<polyline") == 4 + 2  # one per-step line per trial; one line of trials per arm in run order
    assert dom.count('class="chart ratios"') == 1 and 'class="margin-band"' in dom
    # Live figures on a shared CPU say nothing sure about bar lengths (a busy machine can make one arm ten
    # times slower): the pixels of each bar are checked on a stored experiment with known figures
    # (test_report_html.py). Here: the page of a real run renders, both arms drawn.
    png = chromium_screenshot(html, tmp_path)
    assert distinct_colours(png) > 20
    assert pixels_of(png, (0x4e, 0x79, 0xa7)) > 0 and pixels_of(png, (0xf2, 0x8e, 0x2b)) > 0
    assert workers_left(tmp_path) == []


def test_compare_help_states_the_trials_it_really_uses(cli, tmp_path):
    r = cli("compare", "--help-all", COLUMNS="200")
    row = next(line for line in r.stdout.splitlines() if "│ --trials " in line)
    assert row.split("│")[2].strip() == "3"
    r = cli("compare", "--help", COLUMNS="200")
    assert re.search(r"^  --trials .*\(default: 3\)", r.stdout, re.M), r.stdout
    # and 3 is what runs when --trials is not given
    r = cli("compare", "selftest", "--device", "cpu", "--steps", "2", "--arm", "a:step_seconds=0.001", "--arm",
            "b:step_seconds=0.002", "--quiet")
    assert r.returncode == 0, r.stderr
    rows = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT arm, COUNT(*) FROM trials GROUP BY arm").fetchall()
    assert sorted(rows) == [("a", 3), ("b", 3)]


@pytest.mark.quiet  # its verdict reads a 6% timing difference: one trial slowed 11% beside a compile made it equivalent
def test_a_small_real_difference_on_a_real_run_is_named_said_and_drawn(cli, tmp_path):
    """A real CPU compare where one arm's steps take 6% longer, at a ±10% margin: the verdict is
    slower-within-margin (never plain equivalent) in the JSON, the terminal leads with the sentence that says
    both, and the HTML draws the ratio inside the shaded band, left of the line at 1 (checked in Chromium)."""
    import re

    from report_browser import chromium_dom

    # 6% longer steps of 20 ms: a loaded machine's wake-up delays (a few ms a step) shrink the ratio towards 1
    r = cli("compare", "selftest", "--device", "cpu", "--steps", "20", "--step-seconds", "0.02",
            "--arm", "host:step_seconds=0.02", "--arm", "container:step_seconds=0.0212", "--trials", "4",
            "--margin", "0.1", "--order-seed", "3", "--quiet", COLUMNS="80")
    assert r.returncode == 0, r.stderr
    ident = exp_id(r.stdout)
    assert "…" not in r.stdout
    assert re.search(r"container is \d\.\d% slower than host \[\d+\.\d+%–\d+\.\d+%\] on steps/sec, within the\s+"
                     r"±10%\s+you\s+allow", r.stdout), r.stdout[-3000:]
    data = json.loads(cli("report", ident, "--format", "json").stdout)
    (v,) = [v for v in data["verdicts"] if v["headline"]]
    assert v["verdict"] == "slower-within-margin" and 0.9 < v["ci_low"] < v["ci_high"] < 1.0
    assert cli("report", ident, "--format", "html", "-o", "r.html").returncode == 0
    dom = chromium_dom(tmp_path / "r.html", tmp_path)
    ratios = dom.split('class="chart ratios"')[1].split("</svg>")[0]
    band = re.search(r'class="margin-band" x="([\d.]+)" y="[\d.]+" width="([\d.]+)"', ratios)
    one = float(re.search(r'class="one" x1="([\d.]+)"', ratios).group(1))
    point = float(re.search(r'<circle cx="([\d.]+)"', ratios).group(1))
    assert float(band.group(1)) < point < one < float(band.group(1)) + float(band.group(2))
    assert "slower-within-margin" in ratios and 'class="chart trials"' in dom and 'class="chart startup"' in dom
