"""Typed options (gpuvs.params.Param) and the one parser: a value coerced, or refused in one line naming the option."""

import pytest

from gpuvs import workloads
from gpuvs.cli import options as opt
from gpuvs.cli import parser
from gpuvs.errors import UsageError
from gpuvs.params import Param


def test_param_coerces_and_refuses_with_the_option_name():
    p = Param("batch_size", int, 64, min=1)
    assert p.coerce("128") == 128
    for bad in ("0", "-3", "abc", "1.5"):
        with pytest.raises(UsageError, match=r"--batch-size: .* expected an integer >= 1"):
            p.coerce(bad)


@pytest.mark.parametrize("raw", ["nan", "NaN", float("nan"), "inf", "-Infinity", float("inf"), "1" + "0" * 400])
def test_nan_and_infinities_are_refused_by_every_number(raw):
    """float('nan') passes every min/max comparison: --timeout nan was no timeout at all."""
    for p in (Param("timeout", float, 1.0, min=0.001), Param("margin", float, 0.02, min=0.0, max=0.5),
              Param("free", float, None)):
        with pytest.raises(UsageError, match=rf"^{p.option}: .* is not allowed; expected a number.* \(NaN and "
                                             r"infinities are not allowed\)$"):
            p.coerce(raw)
    assert Param("free", float, None).coerce("-1e300") == -1e300


def test_integers_are_bounded_and_a_huge_one_is_one_short_line():
    trials = Param("trials", int, 1, min=1, max=10000)
    for raw in ("9" * 5000, int("9" * 4000), 10 ** 5000):  # Python 3.11 cannot even repr the last
        with pytest.raises(UsageError) as info:
            trials.coerce(raw)
        text = str(info.value)
        assert text.startswith("--trials: ") and text.endswith("expected an integer from 1 to 10000"), text
        assert len(text) < 160 and "\n" not in text
    seed = Param("order_seed", int, None, min=0)
    assert seed.coerce(str(2 ** 63 - 1)) == 2 ** 63 - 1
    with pytest.raises(UsageError, match=r"expected an integer >= 0 \(within ±9223372036854775807\)$"):
        seed.coerce(2 ** 63)
    for raw in (True, [3], {"a": 1}, 2.5):  # not an integer: a YAML `trials: yes` was 1
        with pytest.raises(UsageError, match="expected an integer"):
            trials.coerce(raw)
    assert trials.coerce(3.0) == 3


def test_a_huge_value_is_never_rendered_whole():
    nested: list = ["x"] * 9
    for _ in range(9):  # 9**10 leaves: its repr would take gigabytes
        nested = [nested] * 9
    with pytest.raises(UsageError, match=r"^--name: a list of 9 item\(s\) is not allowed; expected a string$"):
        Param("name", str, None).coerce(nested)
    with pytest.raises(UsageError, match=r"^--ratio: a list of 9 item\(s\) is not allowed"):
        Param("ratio", float, None).coerce(nested)


def test_choices_are_case_insensitive_and_listed_when_wrong():
    p = Param("precision", str, "fp32", choices=("fp32", "bf16"))
    assert p.coerce("BF16") == "bf16"
    with pytest.raises(UsageError, match="one of fp32, bf16"):
        p.coerce("fp64")


def test_bool_and_multiple():
    assert Param("x", bool, False).coerce("yes") is True
    assert Param("x", bool, False).coerce("off") is False
    with pytest.raises(UsageError):
        Param("x", bool, False).coerce("maybe")
    assert Param("m", str, None, multiple=True).coerce(["a", "b"]) == ["a", "b"]


def test_workload_validate_fills_defaults_and_refuses_unknown():
    w = workloads.get("cnn-train")
    values = w.validate({"batch-size": "32"})
    assert values["batch_size"] == 32 and values["model"] == "resnet50" and values["image_size"] == 224
    assert w.validate({"model": "inception3"})["image_size"] == 299
    with pytest.raises(UsageError, match="no parameter 'bogus'"):
        w.validate({"bogus": 1})
    with pytest.raises(UsageError, match="too small for inception3"):
        w.validate({"model": "inception3", "image_size": 64})


def test_cpu_defaults_apply_only_on_cpu_and_never_over_a_given_value():
    w = workloads.get("cnn-train")
    assert w.validate({}, "cuda")["batch_size"] == 64
    assert w.validate({}, "cpu")["batch_size"] == 8
    assert w.validate({"batch_size": 3}, "cpu")["batch_size"] == 3
    # the quick start's first command on a CPU: 96x96 images (224x224 took over two minutes on a busy 2-core
    # machine), large enough for every model's smallest (inception3's 75); a GPU keeps the model's own
    assert w.validate({}, "cpu")["image_size"] == 96 and w.validate({}, "cuda")["image_size"] == 224
    assert w.validate({"model": "inception3"}, "cpu")["image_size"] == 96
    assert w.validate({"model": "inception3"}, "cuda")["image_size"] == 299
    assert w.validate({"image_size": 128}, "cpu")["image_size"] == 128


def test_the_cpu_note_claims_its_time_for_an_idle_machine_and_comes_only_once_the_run_starts(cli):
    from gpuvs.cli import common

    note = common.cpu_note(workloads.get("cnn-train"), {}, "cpu")
    assert note.startswith("note: CPU-sized defaults: --batch-size 8 ") and "under a minute on an idle 2-core CPU, " \
        "longer on a busy one" in note and "well under" not in note
    assert common.cpu_note(workloads.get("cnn-train"), {}, "cuda") == ""
    # a refusal before any trial starts comes alone: the note is about a run that never began
    for argv in (("run", "cnn-train", "--device", "cpu", "--store", "/nonexistent/gpuvs.db"),
                 ("compare", "cnn-train", "--device", "cpu", "--arm", "a:seed=1", "--arm", "b:seed=2", "--store",
                  "/nonexistent/gpuvs.db")):
        r = cli(*argv)
        assert r.returncode == 2 and "cannot create store" in r.stderr and "note:" not in r.stdout + r.stderr, argv
    r = cli("run", "collective", "--device", "cpu", "--num-gpus", "2", "--quiet", COLUMNS="300")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("note: CPU-sized defaults: --max-bytes 1M") and "seconds on an idle 2-core CPU" in lines[0]
    assert "trial 1/1" in lines[1] and r.stdout.count("note: CPU-sized") == 1


def test_an_unknown_name_is_answered_with_the_nearest_known_one():
    from gpuvs.params import did_you_mean

    assert did_you_mean("stepz", ["steps", "seed"]) == " (did you mean 'steps'?)"
    assert did_you_mean("seed", ["stored", "order_seed"]) == ""  # not close enough to guess
    assert did_you_mean("tria", ["trials", "trial", "tries", "store"], n=3, prefix="--") == \
        " (did you mean '--trial' or '--trials'?)"
    assert did_you_mean("stor", ["store", "stored", "stores", "steps"], n=3) == " (did you mean 'store', 'stores' or 'stored'?)"
    with pytest.raises(UsageError, match=r"^cnn-train has no parameter 'batchsize' \(did you mean 'batch_size'\?\); "
                                         "it takes: --model"):
        workloads.get("cnn-train").param("batchsize")


def test_unknown_workload_lists_known_ones():
    with pytest.raises(UsageError, match="known workloads: .*cnn-infer.*cnn-train"):
        workloads.get("resnet")


def test_option_parser_forms_and_errors():
    w = workloads.get("cnn-train")
    groups = (opt.RUN_OPTIONS, opt.ENV_OPTIONS, w.params)
    pos, values = parser.split(["--batch-size", "8", "--model=vgg16", "--quiet", "--ulimit", "a=1", "--ulimit=b=2"],
                               groups, positional=0)
    assert pos == [] and {p.name: v for p, v in values.items()} == {
        "batch_size": "8", "model": "vgg16", "quiet": "true", "ulimit": ["a=1", "b=2"]}
    _, values = parser.split(["--quiet", "false", "--network", "--steps", "3"], groups, positional=0)
    assert {p.name: v for p, v in values.items()} == {"quiet": "false", "network": "true", "steps": "3"}
    with pytest.raises(UsageError, match=r"^unknown option --nope for this command \(did you mean '--node'\?\); this "
                                         "command --help lists its options$"):
        parser.split(["--nope", "1"], groups, positional=0)
    with pytest.raises(UsageError, match="^unknown option --nope for x; options: --batch-size, --steps$"):
        parser.split(["--nope", "1"], [[w.param("batch_size"), w.param("steps")]], positional=0, what="x")
    with pytest.raises(UsageError, match="--steps needs a value"):
        parser.split(["--steps"], groups, positional=0)
    with pytest.raises(UsageError, match="unexpected argument 'extra'"):
        parser.split(["extra"], groups, positional=0)


def test_env_options_belong_to_containers():
    with pytest.raises(UsageError, match="--image applies to --env container, not"):
        opt.env_spec({"env": "host", "image": "x", "gpus": "auto"})
    spec = opt.env_spec({"env": "container", "image": "python:3", "cpus": 2.0, "gpus": "auto", "network": False})
    assert spec.kind == "container" and spec.options == {"image": "python:3", "cpus": 2.0, "gpus": "auto"}


def test_an_unknown_option_in_a_mapping_is_one_line_with_what_is_allowed():
    from gpuvs.params import refuse_unknown

    refuse_unknown({"dry_run": 1}, ["dry_run", "window"], "gpuvs x")  # every name known: no refusal
    with pytest.raises(UsageError) as caught:
        refuse_unknown({"window": 1, "dryrun": 1}, ["dry_run", "window"], "gpuvs x")
    assert str(caught.value) == "unknown option --dryrun for gpuvs x (did you mean '--dry-run'?); it takes --dry-run, --window"
