"""Experiment files and --arm specs: refused with the file, the line and what is wrong; the shipped
files load; command-line values replace the file's."""

import json
import textwrap
from pathlib import Path

import pytest

from gpuvs.trial import experiment
from gpuvs.errors import UsageError
from gpuvs.trial.runner import Experiment
from gpuvs.spec import RunSpec
from gpuvs.workloads import get

from cluster import cluster  # noqa: F401  (the session fixture)

ROOT = Path(__file__).resolve().parents[2]
GOOD = """\
name: tiny
workload: selftest
params: {steps: 3}
device: cpu
trials: 2
margin: 0.05
arms:
  - {name: fast, step_seconds: 0.001}
  - name: slow
    step_seconds: 0.002
"""


def write(tmp_path, text):
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_a_good_file_becomes_an_experiment(tmp_path):
    study = experiment.load(write(tmp_path, GOOD))
    exp = study.experiment
    assert exp.name == "tiny" and exp.trials == 2 and exp.kind == "compare" and study.margin == 0.05
    assert [a.name for a in exp.arms] == ["fast", "slow"]
    assert exp.arms[1].overrides == {"step_seconds": 0.002}
    assert exp.base.params["steps"] == 3 and exp.base.device == "cpu"
    spec = exp.spec_for(exp.arms[1], 0)
    assert spec.params["step_seconds"] == 0.002 and spec.params["steps"] == 3
    assert exp.meta.margin == 0.05 and exp.meta.file.endswith("exp.yaml")


def test_command_line_values_replace_the_files_and_arms_still_apply(tmp_path):
    study = experiment.load(write(tmp_path, GOOD), {"trials": 5, "margin": 0.01, "params": {"steps": "7"},
                                                    "order_seed": 4})
    exp = study.experiment
    assert exp.trials == 5 and study.margin == 0.01 and exp.seed == 4 and exp.base.params["steps"] == 7
    assert exp.spec_for(exp.arms[0], 0).params["step_seconds"] == 0.001
    with pytest.raises(UsageError, match=r"^command line: trials: 0 is not allowed"):
        experiment.load(write(tmp_path, GOOD), {"trials": 0})


BAD = [
    ("unknown top-level key", GOOD.replace("trials: 2", "trails: 2"), 5, "unknown key 'trails' (did you mean 'trials'?)"),
    ("unknown arm key", GOOD.replace("    step_seconds: 0.002", "    step_secs: 0.002"), 10,
     "arm 'slow': unknown key 'step_secs' (did you mean 'step_seconds'?)"),
    ("bad parameter value", GOOD.replace("{steps: 3}", "{steps: -3}"), 3, "steps: -3 is not allowed"),
    ("unknown parameter", GOOD.replace("{steps: 3}", "{stepz: 3}"), 3,
     "selftest has no parameter 'stepz' (did you mean 'steps'?)"),
    ("bad arm value", GOOD.replace("step_seconds: 0.001", "step_seconds: fast"), 8,
     "arm 'fast': --step-seconds: 'fast' is not allowed"),
    ("arms that differ in nothing", GOOD.replace("step_seconds: 0.002", "step_seconds: 0.001"), 9,
     "arm 'slow' runs exactly as arm 'fast' (at " + "{path}:8): arms must differ in something; to compare a setup "
     "with itself (an A/A run) set aa: true (or pass --aa)"),
    ("an A/A run whose arms differ", GOOD + "aa: true\n", 9,
     "arm 'slow' does not run as arm 'fast' (at {path}:8): an A/A run compares a setup with itself, its arms alike; "
     "to compare arms that differ, leave out aa: true"),
    ("one key twice in an arm, spelt two ways", GOOD.replace("    step_seconds: 0.002", "    step_seconds: 0.002\n"
     "    step-seconds: 0.003"), 11, "arm 'slow': key 'step_seconds' is given twice (as 'step_seconds' and "
     "'step-seconds'); give each key once"),
    ("one top-level key twice, spelt two ways", GOOD.replace("device: cpu", "timeout: 5\ndevice: cpu\ntimeout_s: 6"), 6,
     "key 'timeout_s' is given twice (as 'timeout' and 'timeout_s'); give each key once"),
    ("one parameter twice, spelt two ways", GOOD.replace("{steps: 3}", "{steps: 3, step-seconds: 1, step_seconds: 2}"),
     3, "step_seconds: given twice (as 'step-seconds' and 'step_seconds'); give it once"),
    ("an arm equal to the base", GOOD.replace("{name: fast, step_seconds: 0.001}", "{name: fast, steps: 3}")
     .replace("    step_seconds: 0.002", "    steps: 3"), 9, "arms must differ in something"),
    ("missing workload", GOOD.replace("workload: selftest\n", ""), 1, "missing key 'workload'"),
    ("unknown workload", GOOD.replace("workload: selftest", "workload: selfie"), 2, "unknown workload 'selfie'"),
    ("repeated arm name", GOOD.replace("name: slow", "name: fast"), 9, "arm name 'fast' is used twice"),
    ("repeated key", GOOD.replace("trials: 2", "trials: 2\ntrials: 3"), 6, "key 'trials' appears twice"),
    ("one arm", GOOD.split("  - name: slow")[0], 8, "needs at least two arms"),
    ("no arms", GOOD.split("arms:")[0], 1, "missing key 'arms' (a list of at least two mappings, each with a name); "
     "or, to compare a setup with itself (an A/A run), aa: true"),
    ("arms not a list", GOOD.split("arms:")[0] + "arms: {a: 1}\n", 7, "arms must be a list"),
    ("arm without a name", GOOD.replace("name: slow", "label: slow"), 9, "this arm has no name"),
    ("arm not a mapping", GOOD.replace("  - {name: fast, step_seconds: 0.001}", "  - fast"), 8,
     "an arm is a mapping"),
    ("broken YAML", GOOD.replace("params: {steps: 3}", "params: {steps: 3"), 4, "not valid YAML"),
    ("not a mapping", "- just\n- a list\n", 1, "an experiment file is a mapping"),
    ("margin out of range", GOOD.replace("margin: 0.05", "margin: 2"), 6, "margin: 2 is not allowed"),
    ("max_trials alone", GOOD.replace("margin: 0.05", "max_trials: 9"), 6, "max_trials applies with until_confident"),
    ("bad device", GOOD.replace("device: cpu", "device: tpu"), 4, "unknown device 'tpu'"),
    ("unknown environment", GOOD.replace("device: cpu", "device: cpu\nenv: moon"), 5, "unknown environment 'moon'"),
    # NaN passes every range check; no setting is infinite
    ("NaN margin", GOOD.replace("margin: 0.05", "margin: .nan"), 6,
     "margin: nan is not allowed; expected a number from 0 to 0.5 (NaN and infinities are not allowed)"),
    ("NaN as a word", GOOD.replace("margin: 0.05", "margin: nan"), 6, "margin: 'nan' is not allowed"),
    ("infinite timeout", GOOD.replace("device: cpu", "device: cpu\ntimeout: .inf"), 5,
     "timeout_s: inf is not allowed; expected a number >= 0.001 (NaN and infinities are not allowed)"),
    ("NaN arm value", GOOD.replace("step_seconds: 0.001", "step_seconds: .NaN"), 8,
     "arm 'fast': --step-seconds: nan is not allowed"),
    ("NaN parameter", GOOD.replace("{steps: 3}", "{steps: 3, step_seconds: -.inf}"), 3,
     "step_seconds: -inf is not allowed"),
    # an integer of 5,000 digits is beyond Python's int(); the setting says its range, in one short line
    ("5,000-digit trials", GOOD.replace("trials: 2", "trials: " + "9" * 5000), 5,
     "trials: '999999999999999999999999999999999999999... (5000 characters) is not allowed; expected an integer "
     "from 1 to 10000"),
    ("5,000-digit parameter", GOOD.replace("{steps: 3}", "{steps: -" + "1" * 5000 + "}"), 3,
     "steps: '-11111111111111111111111111111111111111... (5001 characters) is not allowed; expected an integer from"),
    ("a boolean count", GOOD.replace("trials: 2", "trials: yes"), 5, "trials: True is not allowed"),
    ("a list for a word", GOOD.replace("name: tiny", "name: [a, b]"), 1,
     "name: a list of 2 item(s) is not allowed; expected a string"),
    ("an alias inside itself", GOOD.split("arms:")[0] + "arms: &a [*a, *a]\n", 7,
     "an alias (*NAME) inside the value it names"),
    ("a list among a command's words", "command: [echo, [a, b]]\ndevice: cpu\narms: [{name: a}, {name: b, trials: 1}]\n",
     1, "a command's words are plain words, not a list or mapping"),
]


@pytest.mark.parametrize("what, text, line, message", BAD, ids=[b[0] for b in BAD])
def test_bad_files_are_refused_with_file_line_and_what(tmp_path, what, text, line, message):
    path = write(tmp_path, text)
    with pytest.raises(UsageError) as info:
        experiment.load(path)
    text = str(info.value)
    assert text.startswith(f"{path}:{line}:"), text
    assert message.replace("{path}", str(path)) in text and "\n" not in text, text


def alias_bomb(levels: int = 9) -> str:
    """The "billion laughs": each level a list of nine aliases of the one above, 9**levels values in ~600 bytes."""
    lines = ["workload: selftest", "device: cpu", "arms:", "  - &l0 [lol,lol,lol,lol,lol,lol,lol,lol,lol]"]
    lines += [f"  - &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines + [f"name: *l{levels - 1}", ""])


def test_an_alias_bomb_is_refused_at_once_in_little_memory(tmp_path, cli):
    """600 bytes of nested aliases took 1.6 GB and 35 s before a MemoryError traceback (the refusal of every
    value rendered it whole). Measured in a process of its own, capped at 1 GiB so that a regression fails fast; its
    peak from VmHWM (this process's own memory): getrusage's ru_maxrss keeps, across exec, what a forked child
    copied of its parent, so a big pytest process made it read 2 GB in CI."""
    import json
    import subprocess
    import sys

    from conftest import gpuvs_env

    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    assert path.stat().st_size < 700
    script = ("import json, resource, sys, time\n"
              "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
              "from gpuvs.trial import experiment\n"
              "from gpuvs.errors import UsageError\n"
              "t0 = time.perf_counter()\n"
              "try:\n"
              "    experiment.load(sys.argv[1], device_default=lambda env: 'cpu')\n"
              "    message = None\n"
              "except UsageError as exc:\n"
              "    message = str(exc)\n"
              "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n"
              "print(json.dumps({'s': time.perf_counter() - t0, 'message': message, 'maxrss_kib': int(hwm)}))\n")
    r = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120,
                       env=gpuvs_env())
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    assert got["message"] == (f"{path}:8: the file holds more than {experiment.MAX_VALUES} values, aliases (*NAME) "
                              f"counted at every use; an experiment file takes at most {experiment.MAX_VALUES}"), got
    assert got["s"] < 1.0 and got["maxrss_kib"] < 100 * 1024, got
    r = cli("compare", "--file", path.name)  # the command line: one line, exit 2, nothing stored
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("gpuvs: error: bomb.yaml:8: the file holds "
                                                                         "more than"), r.stderr
    assert not (tmp_path / "gpuvs.db").exists()


def test_a_commands_words_are_strings_as_written_and_run_as_such(tmp_path, cli):
    """YAML 1.1 read `command: [echo, no, on, 010, 1:30, 0x1F, ~, 1_000]` as False True 8 90 31 None 1000, and
    `command: [true]` looked for a program named True. The words are run for real and their output read back."""
    import shutil
    import sqlite3

    path = tmp_path / "words.yaml"
    path.write_text("command: [echo, no, on, 010, 1:30, 0x1F, ~, 1_000, 'yes', \"1.50\", null, .nan]\n"
                    "device: cpu\ntrials: 1\n"
                    "arms:\n  - {name: echo}\n  - name: true\n    command: [true]\n")
    study = experiment.load(path)
    words = ["echo", "no", "on", "010", "1:30", "0x1F", "~", "1_000", "yes", "1.50", "null", ".nan"]
    assert study.experiment.base.params["argv"] == words
    assert study.experiment.arms[1].overrides == {"argv": ["true"]}
    r = cli("compare", "--file", path.name, "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    rows = db.execute("SELECT t.arm, t.status, t.spec, o.text FROM trials t LEFT JOIN outputs o ON o.trial_id=t.id "
                      "AND o.stream='stdout' ORDER BY t.arm").fetchall()
    db.close()
    by_arm = {arm: (status, json.loads(spec)["params"]["argv"], text) for arm, status, spec, text in rows}
    assert by_arm["echo"] == ("ok", words, " ".join(words[1:]) + "\n"), by_arm
    assert by_arm["true"][:2] == ("ok", ["true"]) and not by_arm["true"][2] and shutil.which("true")


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(UsageError, match="experiment file .*nope.yaml not found"):
        experiment.load(tmp_path / "nope.yaml")


SHIPPED = ("gpu-vs-cpu-train", "gpu-vs-cpu-predict", "fp32-vs-bf16", "nchw-vs-nhwc", "1-vs-n-gpus", "batch-size-sweep")


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_comparisons_load(name):
    path = ROOT / "experiments" / f"{name}.yaml"
    study = experiment.load(path)
    exp = study.experiment
    assert len(exp.arms) >= 2 and exp.trials >= 3 and study.margin == 0.02 and exp.name == name
    for arm in exp.arms:
        spec = exp.spec_for(arm, 0)
        get(spec.workload).validate(spec.params, spec.device)


@pytest.mark.parametrize("path", sorted((ROOT / "experiments").glob("*.yaml")), ids=lambda p: p.name)
def test_every_experiment_file_is_in_the_agreed_format(path):
    doc = experiment.read_file(path)
    assert set(doc) <= experiment.TOP_KEYS and "workload" in doc and len(doc["arms"]) >= 2
    assert all(isinstance(arm, dict) and arm.get("name") for arm in doc["arms"])


def test_gpu_vs_cpu_files_keep_the_cpu_arm_short_and_the_cpu_first():
    for name in ("gpu-vs-cpu-train", "gpu-vs-cpu-predict"):
        exp = experiment.load(ROOT / "experiments" / f"{name}.yaml").experiment
        cpu, gpu = (exp.spec_for(arm, 0) for arm in exp.arms)
        assert (cpu.device, gpu.device) == ("cpu", "cuda")
        assert cpu.params["steps"] <= 10 and cpu.params["batch_size"] == gpu.params["batch_size"] == 32


@pytest.mark.parametrize("text, name, overrides", [
    ("gpu:device=cuda,batch_size=64", "gpu", {"device": "cuda", "batch_size": "64"}),
    ("base", "base", {}),
    ("x: precision = bf16 ,", "x", {"precision": "bf16"}),
])
def test_parse_arm(text, name, overrides):
    assert experiment.parse_arm(text) == (name, overrides)


@pytest.mark.parametrize("text, message", [
    (":device=cpu", "expected NAME:key=value"),
    ("a:device", "expected key=value, got 'device'"),
    # a space where the colon belongs must not become an arm named "a batch_size=2" running the shared settings
    ("a batch_size=2", r"name cannot hold spaces or '='.*did you mean 'a:batch_size=2'\?"),
    ("batch_size=2", r"name cannot hold spaces or '='; write NAME:key=value\[,key=value...\]$"),
    ("my arm:device=cpu", "name cannot hold spaces"),
    # a key repeated inside one --arm is refused as it is in a file, not the last one silently kept
    ("a:steps=2,steps=3", r"^--arm 'a:steps=2,steps=3': key 'steps' is given twice; give each key once$"),
    ("a:timeout=2,timeout_s=3", r"key 'timeout_s' is given twice \(as 'timeout' and 'timeout_s'\)"),
    ("a:batch-size=2,batch_size=3", r"key 'batch_size' is given twice \(as 'batch-size' and 'batch_size'\)"),
])
def test_parse_arm_refuses(text, message):
    with pytest.raises(UsageError, match=message):
        experiment.parse_arm(text)


def test_an_aa_run_makes_two_arms_alike_and_refuses_none(tmp_path):
    """An A/A run (aa: true, or --aa) compares a setup with itself: without arms it makes two, a and b, that run
    exactly alike; the name says A/A where the loader names the experiment."""
    aa = GOOD.split("arms:")[0] + "aa: true\n"
    exp = experiment.load(write(tmp_path, aa)).experiment
    assert [a.name for a in exp.arms] == ["a", "b"] and all(not a.overrides for a in exp.arms)
    assert exp.spec_for(exp.arms[0], 0).params == exp.spec_for(exp.arms[1], 0).params == exp.base.params
    assert exp.trials == 2 and exp.name == "tiny"
    same = GOOD.replace("step_seconds: 0.002", "step_seconds: 0.001") + "aa: true\n"
    assert [a.name for a in experiment.load(write(tmp_path, same)).experiment.arms] == ["fast", "slow"]
    doc = {"workload": "selftest", "device": "cpu", "aa": True}
    assert experiment.study(doc).experiment.name == "selftest: a vs b (A/A)"
    with pytest.raises(UsageError, match=r"--arm #2: arm 'b' runs exactly as arm 'a' \(at --arm #1\): arms must "
                                         r"differ in something; to compare a setup with itself \(an A/A run\) "
                                         r"pass --aa$"):
        experiment.study({**doc, "aa": False, "arms": [{"name": "a"}, {"name": "b"}]})


def test_planning_is_linear_in_the_arms_and_bounded(monkeypatch):
    """Each arm's run is written out once (RunSpec.to_dict), not once per earlier arm: 256 arms, the most a
    comparison takes, cost 256 of them (65,280 before), an A/A run's as many; 257 are refused with one line."""
    calls = []
    to_dict = RunSpec.to_dict
    monkeypatch.setattr(RunSpec, "to_dict", lambda self, *a, **k: calls.append(1) or to_dict(self, *a, **k))
    doc = {"workload": "selftest", "device": "cpu"}
    arms = [{"name": f"a{i}", "steps": i + 1} for i in range(experiment.MAX_ARMS)]
    assert len(experiment.study({**doc, "arms": arms}).experiment.arms) == 256 and len(calls) == 256
    calls.clear()
    alike = [{"name": f"a{i}"} for i in range(experiment.MAX_ARMS)]
    assert len(experiment.study({**doc, "aa": True, "arms": alike}).experiment.arms) == 256 and len(calls) == 256
    with pytest.raises(UsageError, match=r"^--arm #257: 257 arms given; a comparison takes at most 256 \(split"):
        experiment.study({**doc, "arms": arms + [{"name": "one-more", "steps": 999}]})


def test_build_arms_types_values_and_keeps_env_keys_apart():
    wl = get("selftest")
    base = RunSpec(workload="selftest", device="cpu", params=wl.validate({}, "cpu"))
    arms = experiment.build_arms(wl, base, [("a", {"steps": "4", "timeout": "9"}, "--arm", {}),
                                            ("b", {"num-gpus": "1", "steps": "5"}, "--arm", {})])
    assert arms[0].overrides == {"steps": 4, "timeout_s": 9.0} and arms[1].overrides == {"num_gpus": 1, "steps": 5}
    spec = Experiment("x", base, arms).spec_for(arms[0], 0)
    assert spec.timeout_s == 9.0 and spec.params["steps"] == 4
    with pytest.raises(UsageError, match="cpus applies to env container"):
        experiment.build_arms(wl, base, [("a", {"cpus": "2"}, "--arm", {}), ("b", {"steps": "2"}, "--arm", {})])


def test_an_arm_is_sorted_once_and_reads_as_written():
    """One sorting for a file's arm, an --arm and an Arm built in code: each key to its place, typed, the
    order kept for the store; laid over the base, a switch of kind keeps only the options that kind takes."""
    from gpuvs.spec import EnvSpec
    from gpuvs.trial.overrides import Overrides
    from gpuvs.trial.runner import Arm

    wl = get("selftest")
    o = Overrides.sort({"steps": "4", "image": "img:2", "timeout": "9", "env": "container"}, wl)
    assert (o.params, o.options, o.fields, o.env) == ({"steps": 4}, {"image": "img:2"}, {"timeout_s": 9.0},
                                                       "container")
    assert list(o) == ["steps", "image", "timeout_s", "env"] and o == {"steps": 4, "image": "img:2",
                                                                         "timeout_s": 9.0, "env": "container"}
    base = RunSpec(workload="selftest", device="cpu", params={"steps": 2, "text": "x"})
    spec = o.apply(base)
    assert spec.params == {"steps": 4, "text": "x"} and spec.timeout_s == 9.0
    assert spec.env == EnvSpec("container", {"image": "img:2"})
    assert base.params == {"steps": 2, "text": "x"} and base.env.kind == "host"  # the base is left as it was
    boxed = RunSpec(workload="selftest", device="cpu", env=EnvSpec("container", {"cpus": 2.0, "image": "i"}))
    assert Overrides.sort({"env": "host"}).apply(boxed).env == EnvSpec("host", {})  # the host takes neither
    assert Arm("a", {"num-gpus": 2, "steps": 3}).overrides == Overrides.sort({"num_gpus": 2, "steps": 3})
    with pytest.raises(UsageError, match="unknown key 'stepz'"):
        Overrides.sort({"stepz": 1}, wl)


def test_the_command_line_and_a_file_build_the_same_study(tmp_path):
    """`compare WORKLOAD --arm ...` makes the mapping a file holds and the one loader builds both."""
    import dataclasses
    import os

    from rich.console import Console

    from gpuvs.cli import commands, parser
    from gpuvs.cli.commands import compare

    argv = ["selftest", "--device", "cpu", "--steps", "3", "--timeout", "60", "--arm", "fast:step_seconds=0.001",
            "--arm", "slow:step_seconds=0.002", "--trials", "1", "--until-confident"]
    args = parser.parse(commands.get("compare"), argv, "gpuvs compare")
    cli, _ = compare.study_from_args(args, Console(file=open(os.devnull, "w")))
    path = write(tmp_path, "workload: selftest\ndevice: cpu\nparams: {steps: 3}\ntimeout_s: 60\ntrials: 1\n"
                           "until_confident: true\narms: [{name: fast, step_seconds: 0.001},"
                           " {name: slow, step_seconds: 0.002}]\n")
    file = experiment.load(path)
    for study in (cli, file):  # two trials at least where pairs are added, the looks planned with them
        assert study.experiment.trials == 2 and study.max_trials == 20
        assert (study.experiment.meta.sequential.first, study.experiment.meta.sequential.cap) == (2, 20)
    a, b = cli.experiment, file.experiment
    assert dataclasses.replace(a.base, run_id="") == dataclasses.replace(b.base, run_id="")
    assert [(x.name, dict(x.overrides)) for x in a.arms] == [(x.name, dict(x.overrides)) for x in b.arms]
    assert [a.spec_for(x, 0).params for x in a.arms] == [b.spec_for(x, 0).params for x in b.arms]


def test_a_files_default_device_is_its_environments(tmp_path, cluster):
    """A file that names no device gets the device its environment can give, as the command line does: a pod
    on a cluster whose nodes have GPUs runs on cuda even where this machine has none (the file used to fall
    back to the local GPU count, and picked cpu)."""
    from gpuvs.probes import fingerprint

    arms = "arms: [{name: a}, {name: b, steps: 3}]\n"
    pod = write(tmp_path, f"workload: selftest\nenv: pod\nimage: img:1\nkubeconfig: {cluster.kubeconfig}\n{arms}")
    assert cluster.gpus > 0 and experiment.load(pod).experiment.base.device == "cuda"
    host = write(tmp_path, f"workload: selftest\n{arms}")
    assert experiment.load(host).experiment.base.device == ("cuda" if fingerprint.gpu_count() > 0 else "cpu")
