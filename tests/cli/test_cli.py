"""The command line, run as a user runs it: real processes, real SQLite files."""

import json
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from conftest import gpuvs_env, gpuvs_processes


@pytest.mark.parametrize("args, message", [
    (["run", "nosuch"], "unknown workload 'nosuch'; known workloads: "),
    (["run", "cnn-train", "--model", "resnet9"], "--model: 'resnet9' is not allowed; expected one of resnet18, "),
    (["run", "cnn-train", "--batch-size", "0"], "--batch-size: '0' is not allowed; expected an integer from 1"),
    (["run", "cnn-train", "--batch-size", "-4"], "--batch-size: '-4' is not allowed"),
    (["run", "cnn-train", "--colour", "red"], "unknown option --colour for gpuvs run cnn-train; gpuvs run cnn-train --help lists its options"),
    (["run", "cnn-train", "--batchsize", "3"],
     "unknown option --batchsize for gpuvs run cnn-train (did you mean '--batch-size'?); gpuvs run cnn-train --help "
     "lists its options"),
    # the closest few, never the 60 options of every environment kind on one line
    (["run", "selftest", "--retrie", "3"], "unknown option --retrie for gpuvs run selftest (did you mean '--retries'?); "
     "gpuvs run selftest --help lists its options"),
    # a command's own words and options without the -- before them: one line that says to put them after --
    (["run", "command", "python3", "x.py", "--foo"],
     "unknown option --foo for gpuvs run command: put the command after --, e.g. gpuvs run command -- python3 x.py "
     "--foo"),
    (["run", "command", "--trials", "2", "echo", "a b"], "unexpected argument 'echo' for gpuvs run command: put the "
     "command after --, e.g. gpuvs run command --trials 2 -- echo 'a b'"),
    (["run", "command", "--verbose", "--", "true"], "unknown option --verbose for gpuvs run command; if it is the "
     "command's own, put the command after --: gpuvs run command [options] -- PROGRAM --verbose ...; gpuvs run command "
     "--help lists its options"),
    (["run", "cnn-train", "--precision", "fp64"], "expected one of fp32, tf32, fp16, bf16"),
    (["run", "cnn-train", "--device", "cuda"], "device cuda asked for, but this machine has no usable NVIDIA GPU"),
    (["run", "cnn-train", "--device", "cuda", "--num-gpus", "4"], "no usable NVIDIA GPU"),
    (["run", "cnn-train", "--device", "tpu"], "unknown device 'tpu': use cuda, cuda:N or cpu"),
    (["run", "cnn-train", "--data-dir", "/no/such/dir"], "--data-dir '/no/such/dir' is not a folder"),
    (["run", "selftest", "--num-gpus", "2", "--device", "cpu"], "selftest runs on one device"),
    (["run", "cnn-train", "--image", "x"], "--image applies to --env container, not to the host"),
    (["results", "show", "nope"], "no store at gpuvs.db"),
    (["compare", "selftest", "--device", "cpu", "--arm", "a steps=2", "--arm", "b:steps=3"],
     "--arm 'a steps=2': an arm's name cannot hold spaces or '='; write NAME:key=value[,key=value...] "
     "(did you mean 'a:steps=2'?)"),
    # NaN passes every comparison (--timeout nan was no timeout, --margin nan printed "within ±nan%"); no
    # setting is infinite; an integer has a range even where its option declares none
    (["run", "selftest", "--device", "cpu", "--timeout", "nan"],
     "--timeout: 'nan' is not allowed; expected a number >= 0.001 (NaN and infinities are not allowed)"),
    (["run", "selftest", "--device", "cpu", "--timeout", "inf"], "--timeout: 'inf' is not allowed"),
    (["run", "selftest", "--device", "cpu", "--step-seconds", "-inf"], "--step-seconds: '-inf' is not allowed"),
    (["compare", "selftest", "--device", "cpu", "--arm", "a:steps=2", "--arm", "b:steps=3", "--margin", "NaN"],
     "--margin: 'NaN' is not allowed; expected a number from 0 to 0.5"),
    (["compare", "selftest", "--device", "cpu", "--arm", "a:steps=2", "--arm", "b:step_seconds=nan"],
     "--arm #2: arm 'b': --step-seconds: 'nan' is not allowed"),
    (["run", "selftest", "--device", "cpu", "--trials", "9" * 5000],
     "--trials: '999999999999999999999999999999999999999... (5000 characters) is not allowed; expected an integer "
     "from 1 to 10000"),
    (["run", "selftest", "--device", "cpu", "--order-seed", "9" * 30],
     "--order-seed: '999999999999999999999999999999' is not allowed; expected an integer >= 0 (within ±"),
    # --seed is a workload's own seed (weights, data); selftest has none, and the trial order's is --order-seed
    (["compare", "selftest", "--device", "cpu", "--arm", "a:steps=2", "--arm", "b:steps=3", "--seed", "1"],
     "unknown option --seed for gpuvs compare selftest"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_started(cli, tmp_path, args, message):
    r = cli(*args)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    errors = [line for line in r.stderr.splitlines() if line.startswith("gpuvs: error:")]
    assert len(errors) == 1 and message in errors[0], r.stderr
    assert not (tmp_path / "gpuvs.db").exists() or args[0] == "results"
    assert gpuvs_processes() == []


@pytest.mark.parametrize("args, message", [
    (["nosuch"], "no such command 'nosuch'"),                                      # unknown command
    (["results", "nosuch"], "no such command 'nosuch'"),                           # unknown sub-command
    (["comapre"], "no such command 'comapre' (did you mean 'compare'?)"),         # a slip of the keys
    (["results", "shwo"], "no such command 'shwo' (did you mean 'show'?)"),
    (["results", "show"], "missing argument IDENT for gpuvs results show: an experiment id"),  # missing argument
    (["serve-metrics"], "missing option --target for gpuvs serve-metrics: HOST:PORT"),  # missing required option
    (["results", "export", "--format"], "--format needs a value: a string"),       # option without its value
    (["report", "x", "-o"], "-o needs a value: a string"),                         # short option without its value
    (["serve", "--port", "many"], "--port: 'many' is not allowed; expected an integer"),  # bad option value
    (["results", "list", "--colour"], "unknown option --colour for gpuvs results list; options: --store"),
    (["report", "x", "y"], "unexpected argument 'y' for gpuvs report"),           # one argument too many
    (["--nosuch"], "unknown option --nosuch for gpuvs; give a command first: advise-mps, agent, compare, "),
])
def test_cli_parser_errors_are_one_line_exit_2(cli, args, message):
    """The parser's own errors, the same for every command: one line on stderr, exit 2."""
    r = cli(*args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gpuvs: error:") and message in lines[0], r.stderr


def test_no_arguments_prints_help_and_exits_0(cli):
    for args in [(), ("--help",), ("-h",)]:
        r = cli(*args)
        assert r.returncode == 0 and r.stdout.startswith("usage: gpuvs COMMAND") and "│ compare " in r.stdout
    r = cli("results")
    assert r.returncode == 0 and r.stdout.startswith("usage: gpuvs results COMMAND") and "│ export " in r.stdout


def test_help_lists_a_workloads_options(cli):
    r = cli("run", "cnn-train", "--help")
    assert r.returncode == 0 and "--batch-size" in r.stdout and "--data-format" in r.stdout and "--trials" in r.stdout
    r = cli("workloads")
    assert r.returncode == 0 and "cnn-train" in r.stdout and "selftest" in r.stdout


def test_info_works_without_a_gpu(cli):
    r = cli("info", "--json")
    fp = json.loads(r.stdout)
    assert r.returncode == 0 and fp["cpu_count"] >= 1 and "limits" in fp and "torch" in fp
    r = cli("info")
    assert r.returncode == 0 and "CPU" in r.stdout and "cgroup" in r.stdout


def test_run_trials_then_results_list_show_export(cli, tmp_path):
    r = cli("run", "selftest", "--steps", "4", "--trials", "2", "--name", "smoke")
    assert r.returncode == 0, r.stderr
    assert "no NVIDIA GPU found here; running on the CPU" in r.stdout
    assert r.stdout.count("total steps/sec:") == 2 and "Summary across trials" in r.stdout
    r = cli("results", "list")
    assert r.returncode == 0 and "smoke" in r.stdout and "2/2" in r.stdout
    exp_id = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT id FROM experiments").fetchone()[0]
    r = cli("results", "show", exp_id[:12])
    assert r.returncode == 0 and r.stdout.count(" ok ") >= 2
    r = cli("results", "export", "--format", "json", "-o", "all.json")
    data = json.loads((tmp_path / "all.json").read_text())
    assert len(data["trials"]) == 2 and len(data["trials"][0]["samples"]) == 4
    r = cli("results", "export", "--format", "csv")
    assert r.returncode == 0 and len(r.stdout.strip().splitlines()) == 3


def test_failed_trials_make_a_nonzero_exit_after_the_others_ran(cli, tmp_path):
    r = cli("run", "selftest", "--steps", "3", "--trials", "2", "--fail-at-step", "2")
    assert r.returncode == 1 and "2 of 2 trial(s) failed" in r.stderr and "Traceback" not in r.stderr
    rows = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT status, error FROM trials").fetchall()
    assert rows == [("failed", "selftest failed at step 2 as asked")] * 2


def test_timeout_option(cli, tmp_path):
    r = cli("run", "selftest", "--steps", "100", "--step-seconds", "1", "--timeout", "3", "--quiet")
    assert r.returncode == 1 and "timed out after 3 s" in r.stdout
    assert gpuvs_processes() == []


def _wait_for_trials(db, count, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if db.exists():
            try:
                if len(sqlite3.connect(db).execute("SELECT status FROM trials").fetchall()) >= count:
                    return
            except sqlite3.OperationalError:
                pass
        time.sleep(0.2)
    raise AssertionError(f"fewer than {count} trials started in {timeout} s")


@pytest.mark.parametrize("sig, status, said", [
    (signal.SIGINT, 130, "gpuvs: interrupted; finished trials are kept in the store"),       # Ctrl-C
    (signal.SIGTERM, 143, "gpuvs: stopped by SIGTERM; finished trials are kept in the store"),  # Kubernetes, timeout
    (signal.SIGHUP, 129, "gpuvs: stopped by SIGHUP; finished trials are kept in the store"),    # terminal gone
])
def test_a_stop_keeps_finished_trials_and_marks_the_one_in_flight(tmp_path, sig, status, said):
    proc = subprocess.Popen([sys.executable, "-m", "gpuvs", "run", "selftest", "--steps", "6", "--step-seconds",
                             "0.5", "--trials", "3", "--children", "1"], cwd=tmp_path, env=gpuvs_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    db = tmp_path / "gpuvs.db"
    _wait_for_trials(db, 2)  # the second trial is in flight
    time.sleep(2.5)  # a few of its steps are measured (and written: the store is flushed every second)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    assert said in err and "Traceback" not in err
    rows = sqlite3.connect(db).execute("SELECT trial, status, error FROM trials ORDER BY id").fetchall()
    expected = "interrupted by the user" if sig == signal.SIGINT else f"gpuvs was stopped by {signal.Signals(sig).name}"
    assert rows == [(0, "ok", None), (1, "interrupted", expected)]
    counts = dict(sqlite3.connect(db).execute("SELECT t.trial, COUNT(*) FROM samples s JOIN trials t "
                                              "ON t.id=s.trial_id GROUP BY t.trial").fetchall())
    assert counts[0] == 6 and 1 <= counts.get(1, 0) < 6  # what the interrupted trial measured is kept
    time.sleep(0.5)
    assert gpuvs_processes() == []  # the worker and its children (they carry this session's tag too)


def test_sigkill_keeps_what_the_trial_in_flight_measured_and_leaves_no_worker(tmp_path):
    """gpuvs killed outright cannot clean up after itself: the samples it had written while the trial ran are
    kept, the next open of the store marks the trial interrupted, and the worker's group ends on its own."""
    proc = subprocess.Popen([sys.executable, "-m", "gpuvs", "run", "selftest", "--steps", "40", "--step-seconds",
                             "0.2", "--children", "1", "--quiet"], cwd=tmp_path, env=gpuvs_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    db = tmp_path / "gpuvs.db"
    deadline = time.time() + 120
    stored = 0
    while time.time() < deadline and stored < 8:  # samples reach the store while the trial runs
        time.sleep(0.3)
        try:
            stored = sqlite3.connect(db).execute("SELECT COUNT(*) FROM samples").fetchone()[0] if db.exists() else 0
        except sqlite3.OperationalError:
            stored = 0
    assert stored >= 8, "no samples were written while the trial ran"
    proc.kill()
    proc.communicate(timeout=30)
    time.sleep(1.5)  # the worker's watch notices within half a second
    assert gpuvs_processes() == []  # the worker's group, its child included
    r = subprocess.run([sys.executable, "-m", "gpuvs", "results", "show", "1"], cwd=tmp_path, env=gpuvs_env(),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "interrupted" in r.stdout, r.stdout + r.stderr
    row = sqlite3.connect(db).execute("SELECT status, summary FROM trials").fetchone()
    kept = sqlite3.connect(db).execute("SELECT COUNT(*) FROM samples").fetchone()[0]
    assert row[0] == "interrupted" and kept >= stored and json.loads(row[1])["main"]["n"] == kept


@pytest.mark.parametrize("args", [["run", "--help"], ["run", "cnn-train", "--help"], ["compare", "--help"],
                                  ["share", "--help"], ["doctor", "--help"], ["advise-mps", "--help"],
                                  ["share-matrix", "--help"], ["report", "--help"], ["serve", "--help"],
                                  ["validate", "--help"]])
def test_every_command_explains_itself(cli, args):
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "option" in r.stdout.lower()


def prepared(command: str, *argv: str):
    """A command's RunSpec as the command line prepares it (parse, then common.prepare)."""
    import os

    from rich.console import Console

    from gpuvs.cli import commands, common, parser

    args = parser.parse(commands.get(command), list(argv), f"gpuvs {command}")
    return args, common.prepare(args, Console(file=open(os.devnull, "w")))


def test_seed_is_the_workloads_and_order_seed_the_trial_orders():
    _, prep = prepared("run", "cnn-train", "--device", "cpu", "--seed", "3", "--order-seed", "7")
    assert prep.base.params["seed"] == 3 and prep.run["order_seed"] == 7
    _, prep = prepared("run", "cnn-train", "--device", "cpu")
    assert prep.base.params["seed"] == 0 and prep.run["order_seed"] is None


def test_a_commands_own_option_wins_over_an_environment_option_of_that_name(capsys, monkeypatch):
    """gpuvs fleet's --label writes node labels; the pod option --label (extra pod labels) is not reachable
    there, and the help says so; compare --stored takes two values in a row."""
    from gpuvs.cli import commands, help, parser

    fleet = commands.get("fleet")
    args = parser.parse(fleet, ["spin", "--label", "--image", "x"], "gpuvs fleet")
    assert args.group("fleet")["label"] is True and "label" not in args.group("env")
    assert args.group("env")["env"] == "pod" and args.group("env")["image"] == "x"
    monkeypatch.setenv("COLUMNS", "300")
    help.command_help(fleet, "gpuvs fleet", full=True)
    assert "--env pod options (a Kubernetes pod (kubeconfig or in-cluster)) (--label is the fleet's here)" in \
        capsys.readouterr().out
    args = parser.parse(commands.get("compare"), ["--stored", "a", "b:x", "--margin", "0.1"], "gpuvs compare")
    assert args.form.marker == "stored" and args["stored"] == ["a", "b:x"] and args["margin"] == 0.1
