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
    with pytest.raises(UsageError, match="unknown option --nope .* options: .*--batch-size"):
        parser.split(["--nope", "1"], groups, positional=0)
    with pytest.raises(UsageError, match="--steps needs a value"):
        parser.split(["--steps"], groups, positional=0)
    with pytest.raises(UsageError, match="unexpected argument 'extra'"):
        parser.split(["extra"], groups, positional=0)


def test_env_options_belong_to_containers():
    with pytest.raises(UsageError, match="--image applies to --env container, not"):
        opt.env_spec({"env": "host", "image": "x", "gpus": "auto"})
    spec = opt.env_spec({"env": "container", "image": "python:3", "cpus": 2.0, "gpus": "auto", "network": False})
    assert spec.kind == "container" and spec.options == {"image": "python:3", "cpus": 2.0, "gpus": "auto"}
