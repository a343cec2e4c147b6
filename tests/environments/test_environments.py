"""The environments registry: one module per kind declares its options, checks, label and fingerprint fields.

The command line, experiment files, the runner and comparisons only ask the registry.
A new kind registered here, with no other change, is parsed, checked, labelled and run like the built-in ones."""

import ast
from pathlib import Path

import pytest

from gpuvs import environments, workloads
from gpuvs.analysis import comparison
from gpuvs.trial import experiment
from gpuvs.cli import options as opt
from gpuvs.cli import parser
from gpuvs.environments.environment import Environment
from gpuvs.environments.host import HostEnvironment
from gpuvs.errors import UsageError
from gpuvs.params import Param
from gpuvs.trial.runner import Arm, Experiment, Runner, validate_spec
from gpuvs.spec import EnvSpec, RunSpec
from gpuvs.store.db import Store

SRC = Path(__file__).resolve().parents[2] / "src" / "gpuvs"


class LocalTwin(HostEnvironment):
    """A test kind: a host process under another name, with options of its own and a shared one."""

    kind = "twin"
    summary = "a host process, for the registry's test"
    noun = "a twin"
    rank = 99
    params = (Param("flavour", str, "plain", "a choice of the twin", choices=("plain", "salted")),
              Param("memory", str, None, "a memory limit, shared with the container kind"),
              Param("env_var", str, None, "KEY=VALUE", multiple=True))
    fingerprint_fields = (("twin_field", "twin field"),)
    explains = {"env": ("*",), "flavour": ("cpu_model",)}

    @classmethod
    def label(cls, options):
        return f"twin:{options.get('flavour', 'plain')}"

    def check(self, spec):
        if self.options.get("flavour") == "salted" and spec.device != "cpu":
            raise UsageError("a salted twin runs on the cpu only")
        super().check(spec)


@pytest.fixture
def twin():
    environments.register(LocalTwin)
    try:
        yield LocalTwin
    finally:
        environments._REGISTRY.pop("twin", None)


def test_built_in_kinds_and_their_options_come_from_their_modules():
    assert environments.names()[:2] == ["host", "container"]
    keys = environments.option_keys()
    for name in environments.names():
        cls = environments.kind(name)
        assert all(p.name in keys for p in cls.params) and set(cls.internal_keys) <= set(keys)
    assert environments.param("cpus").type is float and environments.param("nope") is None
    assert [p.name for p in opt.ENV_OPTIONS][0] == "env"
    with pytest.raises(UsageError, match="unknown environment 'moon'; known: host, container, pod"):
        environments.kind("moon")


def test_a_new_kind_is_one_registration(twin, tmp_path):
    assert environments.names()[-1] == "twin" and "flavour" in environments.option_keys()
    assert "twin" in environments.env_param().choices
    # the command line's one group now knows --flavour; the help has a table for the twin
    groups = (opt.RUN_OPTIONS, environments.params())
    _, values = parser.split(["--env", "twin", "--flavour", "salted", "--memory", "1g"], groups, positional=0)
    env = environments.env_spec({p.name: p.coerce(v) for p, v in values.items()})
    assert env == EnvSpec("twin", {"flavour": "salted", "memory": "1g"})
    assert any(g.title.startswith("--env twin options") for g in opt.env_groups())
    with pytest.raises(UsageError, match="--flavour: 'pepper' is not allowed; expected one of plain, salted"):
        environments.env_spec({"env": "twin", "flavour": "pepper"})
    # options of other kinds are refused by name; shared ones name every kind that takes them
    with pytest.raises(UsageError, match=r"^--image applies to --env container, not to a twin \(--env pod takes it too\)$"):
        environments.env_spec({"env": "twin", "image": "x"})
    with pytest.raises(UsageError, match=r"^--flavour applies to --env twin, not to the host$"):
        environments.env_spec({"env": "host", "flavour": "salted"})
    with pytest.raises(UsageError, match=r"^memory applies to env container, not to the host "
                                         r"\(env pod, env twin takes it too\)$"):
        environments.check_options("host", {"memory": "1g"}, cli=False)
    # an experiment's arm may switch to it; its check runs before anything starts; it runs like any kind
    wl = workloads.get("selftest")
    base = RunSpec(workload="selftest", device="cpu", params=wl.validate({"steps": 3}, "cpu"))
    arms = experiment.build_arms(wl, base, [("host", {}, "--arm #1", {}),
                                            ("twin", {"env": "twin", "flavour": "salted"}, "--arm #2", {})])
    exp = Experiment("x", base, arms, trials=1, seed=1)
    spec = exp.spec_for(arms[1], 0)
    assert spec.env == EnvSpec("twin", {"flavour": "salted"}) and environments.label(spec.env) == "twin:salted"
    with pytest.raises(UsageError, match="a salted twin runs on the cpu only"):
        validate_spec(RunSpec(workload="selftest", device="cuda", env=spec.env))
    with Store(tmp_path / "s.db") as store:
        results = Runner(store).run_experiment(exp)
        assert [r.status for r in results] == ["ok", "ok"]
        a = comparison.from_store(store, exp.id)
    assert {arm.name: arm.env for arm in a.arms} == {"host": "host", "twin": "twin:salted"}
    # varying env into a kind whose `explains` has "*" explains every key field
    assert environments.explained({"env"}, {"host", "twin"}) >= {"gpu_name", "driver", "torch"}
    assert environments.explained({"flavour"}, {"twin"}) == {"cpu_model"}
    assert environments.explained({"steps"}, {"host", "twin"}) == set()
    assert ("twin_field", "twin field") in comparison.fingerprint_fields()


def test_two_kinds_must_agree_on_a_shared_option(twin):
    class Clash(Environment):
        kind = "clash"
        rank = 100
        params = (Param("flavour", int, 1, "an integer, where the twin has a string"),)

    environments.register(Clash)
    try:
        with pytest.raises(RuntimeError, match="option 'flavour' is declared as str by environment twin and as "
                                               "int by clash"):
            environments.params()
    finally:
        environments._REGISTRY.pop("clash", None)


def kinds_named(text: str, kinds: list[str]) -> list[str]:
    """Where code decides by a kind's name or builds one: 'line: kind' for a kind's name (quoted) compared
    with something, matched in a case, given after "--env", as EnvSpec's kind, as a kind=/env= argument,
    or as the value of an "env"/"kind" key. The same word as a fingerprint key or a label is not a kind."""
    found: list[tuple[int, int, str]] = []

    def named(node) -> list[ast.Constant]:
        elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return [e for e in elts if isinstance(e, ast.Constant) and e.value in kinds]

    for node in ast.walk(ast.parse(text)):
        hits: list[ast.Constant] = []
        if isinstance(node, ast.Compare):
            hits = [c for operand in (node.left, *node.comparators) for c in named(operand)]
        elif isinstance(node, ast.MatchValue):
            hits = named(node.value)
        elif isinstance(node, (ast.List, ast.Tuple)):
            hits = [b for a, b in zip(node.elts, node.elts[1:])
                    if isinstance(a, ast.Constant) and a.value == "--env" and named(b)]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "EnvSpec":
            hits = named(node.args[0]) if node.args else []
        elif isinstance(node, ast.keyword) and node.arg in ("kind", "env"):
            hits = named(node.value)
        elif isinstance(node, ast.Dict):
            hits = [c for k, v in zip(node.keys, node.values)
                    if isinstance(k, ast.Constant) and k.value in ("kind", "env") for c in named(v)]
        found += [(c.lineno, c.col_offset, c.value) for c in hits]
    return [f"{line}: {value}" for line, _, value in sorted(found)]


def test_the_kind_guard_sees_each_way_of_naming_a_kind():
    code = ('if spec.env.kind == "pod": pass\nif kind in ("container", "x"): pass\nargs = ["--env", "pod"]\n'
            'e = EnvSpec("container")\nf(kind="pod")\nd = {"env": "container"}\nmatch k:\n    case "pod": pass\n'
            'fp.get("container")\nrow = ("container", "yes")\nunit = "container" if x != "host" else "process"\n')
    assert kinds_named(code, ["container", "pod"]) == ["1: pod", "2: container", "3: pod", "4: container",
                                                       "5: pod", "6: container", "8: pod"]


def test_no_module_outside_environments_names_a_kind():
    """Every module of src/gpuvs but the environments package itself asks gpuvs.environments about kinds
    instead of naming one (the default kind, host, may be named: it is EnvSpec's own default)."""
    kinds = [k for k in environments.names() if k != environments.DEFAULT]
    modules = [p for p in sorted(SRC.rglob("*.py")) if "environments" not in p.relative_to(SRC).parts]
    assert len(modules) > 100 and SRC / "cli" / "commands" / "fleet.py" in modules
    found = {str(p.relative_to(SRC)): kinds_named(p.read_text(), kinds) for p in modules}
    assert {m: f for m, f in found.items() if f} == {}, "these name kinds: ask gpuvs.environments instead"
