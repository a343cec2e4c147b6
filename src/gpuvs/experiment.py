"""Comparisons as data: arms given on the command line (`--arm NAME:key=value,...`) or in an
experiment file (YAML), checked before anything starts and turned into a runner.Experiment.

Every problem is one line that says where it is: `FILE:LINE: what is wrong` for a file (line
numbers from YAML's node marks), `--arm #N: arm 'NAME': ...` for the command line.

An arm's keys other than `name` are overrides: a RunSpec field (device, num_gpus, timeout_s,
telemetry_interval_s, fresh), `env`, an environment option (environments.option_keys()) or a workload parameter.
Every arm shares the base's parameters (its device's defaults filled in) unless it overrides them,
so arms differ only in what they name."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuvs import environments, workloads
from gpuvs.errors import UsageError
from gpuvs.launch import FRESH
from gpuvs.params import Param
from gpuvs.records import ExperimentMeta
from gpuvs.runner import SPEC_FIELDS, Arm, Experiment
from gpuvs.spec import EnvSpec, RunSpec, check_device_syntax

DEFAULT_TRIALS = 3
DEFAULT_MAX_TRIALS = 20

# Keys of an experiment file's top level (besides RunSpec fields, env and environment options).
STUDY_PARAMS = (
    Param("name", str, None, "a name for the experiment"),
    Param("description", str, "", "free text"),
    Param("trials", int, DEFAULT_TRIALS, "trials per arm", min=1, max=10000),
    Param("margin", float, 0.02, "equivalence margin of the ratio (0.02: +/-2%)", min=0.0, max=0.5),
    Param("confidence", float, 0.95, "confidence level of the interval and the verdict", min=0.5, max=0.999),
    Param("order_seed", int, None, "seed of the shuffled trial order (a workload's seed goes under params)", min=0),
    Param("until_confident", bool, False, "add trial pairs until the verdict is settled"),
    Param("max_trials", int, None, "trials per arm at most, with until_confident", min=2, max=10000),
    Param("retries", int, 0, "times a crashed or timed-out trial is run again", min=0, max=100),
)
SPEC_PARAMS = {
    "device": Param("device", str, None, "cuda, cuda:N or cpu"),
    "num_gpus": Param("num_gpus", int, 1, "data-parallel processes", min=1, max=1024),
    "timeout_s": Param("timeout_s", float, None, "seconds a trial may take", min=0.001),
    "telemetry_interval_s": Param("telemetry_interval_s", float, 0.1, "seconds between NVML readings",
                                  min=0.0, max=3600.0),
    "fresh": FRESH,
}
ALIASES = {"timeout": "timeout_s", "telemetry_interval": "telemetry_interval_s"}  # the CLI's spellings
COMMAND_KEY = "command"  # a file's (and an arm's) command line: the argv of a workload that takes one


@dataclass
class Study:
    """A comparison ready to run: the experiment and how its verdict is judged."""

    experiment: Experiment
    margin: float = 0.02
    confidence: float = 0.95
    until_confident: bool = False
    max_trials: int | None = None
    retries: int = 0
    source: str | None = None


# -- one override ---------------------------------------------------------------------------------

def normalise_key(key: Any) -> str:
    key = str(key).strip().replace("-", "_")
    return ALIASES.get(key, key)


def coerce_override(workload: workloads.Workload, key: str, value: Any) -> tuple[str, Any]:
    """(key, typed value) of one arm override; UsageError (no location) if the key or value is bad."""
    key = normalise_key(key)
    if key == COMMAND_KEY and workload.argv_param:
        key = workload.argv_param
    if key in workload.fixed_params:
        raise UsageError(f"{key} cannot differ between arms: it says which figures a trial gives and how they are "
                         f"read, and arms are compared figure by figure (set it for the whole comparison)")
    if key in SPEC_FIELDS:
        value = SPEC_PARAMS[key].coerce(value)
        if key == "device":
            check_device_syntax(value)
        return key, value
    if key == "env":
        return key, environments.kind(str(value)).kind
    env_keys = environments.option_keys()
    if key in env_keys:
        param = environments.param(key)
        return key, value if param is None else param.coerce(value)
    names = {p.name for p in workload.params}
    if key in names:
        return key, workload.param(key).coerce(value)
    close = difflib.get_close_matches(key, sorted(names | set(SPEC_FIELDS) | set(env_keys) | {"env"}), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UsageError(f"unknown key {key!r}{hint}: not a run-spec field ({', '.join(SPEC_FIELDS)}), env, an "
                     f"environment option or a {workload.name} parameter ({', '.join(sorted(names))})")


# -- arms -> experiment ---------------------------------------------------------------------------

def parse_arm(text: str) -> tuple[str, dict[str, str]]:
    """'gpu:device=cuda,batch_size=64' -> ('gpu', {'device': 'cuda', 'batch_size': '64'})."""
    name, colon, rest = text.partition(":")
    name = name.strip()
    if not name:
        raise UsageError(f"--arm {text!r}: expected NAME:key=value[,key=value...]")
    if "=" in name or any(c.isspace() for c in name):
        # 'a batch_size=2' (a space where the colon belongs) would otherwise be an arm named
        # 'a batch_size=2' that silently runs the shared settings
        first, _, after = text.strip().partition(" ")
        guess = f"{first}:{after.strip()}" if not colon and after.strip() and "=" not in first else None
        hint = f" (did you mean {guess!r}?)" if guess else ""
        raise UsageError(f"--arm {text!r}: an arm's name cannot hold spaces or '='; write NAME:key=value"
                         f"[,key=value...]{hint}")
    overrides: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--arm {name}: expected key=value, got {item!r}")
        overrides[key.strip()] = value.strip()
    return name, overrides


def _identity(spec: RunSpec) -> str:
    data = spec.to_dict()
    for k in ("arm", "trial", "run_id", "experiment_id", "launched_at"):
        data.pop(k, None)
    return json.dumps(data, sort_keys=True, default=str)


RawArm = tuple  # (name, raw overrides, where, {key: where of that key})


def build_arms(workload: workloads.Workload, base: RunSpec, raw_arms: list[RawArm]) -> list[Arm]:
    """Checked arms from (name, raw overrides, where, key locations); a location prefixes every
    message ('FILE:LINE' or '--arm #N'). Refuses fewer than two arms, repeated names, bad keys and
    values, and arms that run exactly as another."""
    if len(raw_arms) < 2:
        where = raw_arms[0][2] if raw_arms else "compare"
        raise UsageError(f"{where}: a comparison needs at least two arms, got {len(raw_arms)}")
    arms: list[Arm] = []
    seen: dict[str, str] = {}
    probe = Experiment("probe", base, [], seed=0)
    for name, raw, where, key_where in raw_arms:
        if name in seen:
            raise UsageError(f"{where}: arm name {name!r} is used twice (first at {seen[name]})")
        overrides = {}
        for key, value in raw.items():
            try:
                k, v = coerce_override(workload, key, value)
            except UsageError as exc:
                raise UsageError(f"{key_where.get(key, where)}: arm {name!r}: {exc}") from None
            overrides[k] = v
        arm = Arm(name, overrides)
        spec = probe.spec_for(arm, 0)
        try:
            workload.validate(spec.params, spec.device)
            environments.check_options(spec.env.kind, spec.env.options, cli=False)
        except UsageError as exc:
            raise UsageError(f"{where}: arm {name!r}: {exc}") from None
        for other in arms:
            if _identity(probe.spec_for(other, 0)) == _identity(spec):
                raise UsageError(f"{where}: arm {name!r} runs exactly as arm {other.name!r} (at {seen[other.name]}): "
                                 "arms must differ in something")
        seen[name] = where
        arms.append(arm)
    return arms


# -- experiment files -----------------------------------------------------------------------------

class _Map(dict):
    """A YAML mapping that remembers the line of each key (1-based) and its own."""

    line: int = 0
    lines: dict[str, int]


class _List(list):
    line: int = 0
    lines: list[int]


MAX_VALUES = 10_000  # values a file may hold, an alias (*NAME) counted at every use: no "billion laughs"
WORD_KEYS = frozenset({COMMAND_KEY, "argv"})  # a command line: its words are strings as written
TEXT_KEYS = frozenset({"name", "description"})  # names and text as written: an arm named `true` is not True
LONGEST_INT = 100  # digits: a longer integer is kept as its text, which its setting refuses with its range


class _Loader(yaml.SafeLoader):
    """SafeLoader that counts values as it composes, aliases at every use, and refuses past MAX_VALUES (a few
    hundred bytes of nested aliases expand to billions of values); that keeps a command's words as written
    (`command: [true, no, 010, ~]` is not True, False, 8, None); and that keeps an integer too long for Python's
    int() as its text (the setting then refuses it with its range)."""

    kind = "experiment file"  # what the file is, for the refusal

    def __init__(self, stream):
        super().__init__(stream)
        self._sizes: dict[int, int] = {}  # id(node) -> values it holds, aliases expanded
        self._values = 0

    def compose_node(self, parent, index):
        alias = self.check_event(yaml.AliasEvent)
        line = self.peek_event().start_mark.line + 1
        node = super().compose_node(parent, index)
        if alias:
            size = self._sizes.get(id(node))
            if size is None:
                raise _FileError(line, "an alias (*NAME) inside the value it names: a value cannot hold itself")
        else:
            if isinstance(node, yaml.SequenceNode):
                children = node.value
            elif isinstance(node, yaml.MappingNode):
                children = [child for pair in node.value for child in pair]
            else:
                children = []
            size = 1 + sum(self._sizes[id(child)] for child in children)
            self._sizes[id(node)] = size
            size = 1  # its children were counted as they came
        self._values += size
        if self._values > MAX_VALUES:
            raise _FileError(line, f"the file holds more than {MAX_VALUES} values" + (
                ", aliases (*NAME) counted at every use" if alias or self._values > len(self._sizes) else "")
                + f"; {_article(self.kind)} takes at most {MAX_VALUES}")
        return node

    def construct_yaml_int(self, node):
        digits = node.value.replace("_", "").lstrip("+-")
        if len(digits) > LONGEST_INT:
            return node.value
        return super().construct_yaml_int(node)


def _article(kind: str) -> str:
    return ("an " if kind[:1] in "aeiou" else "a ") + kind


def _words(loader: _Loader, node: yaml.Node) -> Any:
    """A command line's value: each word the scalar's text as written (quotes removed), never resolved."""
    if isinstance(node, yaml.ScalarNode):
        return node.value
    if not isinstance(node, yaml.SequenceNode):
        return loader.construct_object(node, deep=True)  # a mapping: its setting refuses it
    out = _List()
    out.line, out.lines = node.start_mark.line + 1, []
    for child in node.value:
        if not isinstance(child, yaml.ScalarNode):
            raise _FileError(child.start_mark.line + 1, "a command's words are plain words, not a list or mapping")
        out.append(child.value)
        out.lines.append(child.start_mark.line + 1)
    return out


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> _Map:
    loader.flatten_mapping(node)
    out = _Map()
    out.line, out.lines = node.start_mark.line + 1, {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, (str, int, float, bool)):
            raise _FileError(key_node.start_mark.line + 1, "a key must be a plain word")
        key = str(key)
        if key in out:
            raise _FileError(key_node.start_mark.line + 1, f"key {key!r} appears twice in this mapping "
                             f"(first at line {out.lines[key]})")
        if normalise_key(key) in WORD_KEYS:
            out[key] = _words(loader, value_node)
        elif key in TEXT_KEYS and isinstance(value_node, yaml.ScalarNode) and value_node.tag != "tag:yaml.org,2002:null":
            out[key] = value_node.value
        else:
            out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = key_node.start_mark.line + 1
    return out


def _construct_list(loader: _Loader, node: yaml.SequenceNode) -> _List:
    out = _List(loader.construct_object(child, deep=True) for child in node.value)
    out.line, out.lines = node.start_mark.line + 1, [child.start_mark.line + 1 for child in node.value]
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_list)
_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)


class _FileError(Exception):
    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line, self.message = line, message


def load_yaml(path: str | Path, kind: str = "experiment file") -> Any:
    """A YAML file (an experiment file, a pairs file) read with the bounded loader above: its document, mappings as
    _Map and lists as _List with their lines; UsageError naming FILE:LINE otherwise (`kind` says what the file is)."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UsageError(f"{kind} {path} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {kind} {path}: {exc}") from None
    loader = _Loader(text)
    loader.kind = kind
    try:
        return loader.get_single_data()  # what yaml.load does, with the loader told what the file is
    except _FileError as exc:
        raise UsageError(f"{path}:{exc.line}: {exc.message}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f"{mark.line + 1}:{mark.column + 1}" if mark else "1"
        raise UsageError(f"{path}:{line}: not valid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: not valid YAML: {exc}") from None
    finally:
        loader.dispose()


def read_file(path: str | Path) -> _Map:
    """The file's top-level mapping, with line numbers; UsageError naming the file otherwise."""
    doc = load_yaml(path)
    if not isinstance(doc, _Map):
        raise UsageError(f"{path}:1: an experiment file is a mapping (name:, workload:, arms: ...)")
    return doc


def workload_name(doc: dict[str, Any]) -> str:
    """The workload an experiment file names: its `workload`, else the command workload where it gives `command`."""
    if doc.get("workload") is None and COMMAND_KEY in doc:
        return COMMAND_KEY
    return str(doc.get("workload"))


def top_keys() -> set[str]:
    """The keys an experiment file's top level takes."""
    return ({p.name for p in STUDY_PARAMS} | set(SPEC_FIELDS) | set(environments.option_keys())
            | {"workload", "params", "env", "arms", COMMAND_KEY})


TOP_KEYS = frozenset(top_keys())


def load(path: str | Path, cli: dict[str, Any] | None = None, device_fallback: str | None = None) -> Study:
    """An experiment file as a Study. `cli` holds command-line values that replace the file's
    top-level ones (same keys; its 'params' are merged into the file's); `device_fallback` is the
    device where neither names one (default: cuda where a GPU is present, else cpu)."""
    path = Path(path)
    doc = read_file(path)
    cli = dict(cli or {})
    cli_params = dict(cli.pop("params", None) or {})
    top: dict[str, tuple[Any, str]] = {}  # key -> (value, where it came from)
    allowed = TOP_KEYS
    env_keys = environments.option_keys()
    for key, value in doc.items():
        norm, loc = normalise_key(key), f"{path}:{doc.lines[key]}"
        if norm == "seed":
            raise UsageError(f"{loc}: 'seed' is ambiguous here: write order_seed for the trial order, or "
                             "params: {seed: N} for the workload's own seed")
        if norm not in allowed:
            raise UsageError(f"{loc}: unknown key {key!r}; an experiment file takes: {', '.join(sorted(allowed))}")
        top[norm] = (value, loc)
    for key, value in cli.items():
        top[normalise_key(key)] = (value, "command line")
    if "workload" not in top and COMMAND_KEY in top:  # `command: [PROGRAM, ARGS...]`: the command workload
        top["workload"] = (COMMAND_KEY, top[COMMAND_KEY][1])
    if "workload" not in top:
        raise UsageError(f"{path}:{doc.line}: missing key 'workload' (one of: {', '.join(workloads.names())})")
    try:
        workload = workloads.get(str(top["workload"][0]))
    except UsageError as exc:
        raise UsageError(f"{top['workload'][1]}: {exc}") from None
    if COMMAND_KEY in top:
        if not workload.argv_param:
            raise UsageError(f"{top[COMMAND_KEY][1]}: '{COMMAND_KEY}' is the command workload's command line; "
                             f"{workload.name} takes none")
        command, loc = top.pop(COMMAND_KEY)
        if not isinstance(command, list) and not isinstance(command, str):
            raise UsageError(f"{loc}: {COMMAND_KEY} is a list of words, e.g. {COMMAND_KEY}: [sysbench, cpu, run]")
        file_command = [(workload.argv_param, command, loc)]  # words after `--` on the command line replace it
    else:
        file_command = []

    opts: dict[str, Any] = {}
    for p in STUDY_PARAMS:
        if p.name in top:
            value, loc = top[p.name]
            try:
                opts[p.name] = p.coerce(value)
            except UsageError as exc:
                raise UsageError(f"{loc}: {_as_key(exc)}") from None
        else:
            opts[p.name] = p.default
    fields: dict[str, Any] = {}
    env_options: dict[str, Any] = {}
    for key, (value, loc) in top.items():
        if key in SPEC_FIELDS or key == "env" or key in env_keys:
            try:
                k, v = coerce_override(workload, key, value)
            except UsageError as exc:
                raise UsageError(f"{loc}: {_as_key(exc)}") from None
            (env_options if k in env_keys else fields)[k] = v
    device = fields.get("device") or device_fallback or _default_device()

    params_raw, params_loc = top.get("params", (None, f"{path}:{doc.line}"))
    params_raw = _Map() if params_raw is None else params_raw
    if not isinstance(params_raw, dict):
        raise UsageError(f"{params_loc}: params must be a mapping of {workload.name} parameters (batch_size: 64, ...)")
    given: dict[str, Any] = {}
    sources = [(k, v, f"{path}:{params_raw.lines[k]}" if isinstance(params_raw, _Map) else params_loc)
               for k, v in params_raw.items()] + file_command + [(k, v, "command line") for k, v in cli_params.items()]
    for key, value, loc in sources:
        try:
            param = workload.param(normalise_key(key))
            given[param.name] = param.coerce(value)
        except UsageError as exc:
            raise UsageError(f"{loc}: {_as_key(exc)}") from None
    try:
        params = workload.validate(given, device)
    except UsageError as exc:
        raise UsageError(f"{params_loc}: {_as_key(exc)}") from None
    base = RunSpec(workload=workload.name, params=params, device=device, num_gpus=fields.get("num_gpus", 1),
                   env=EnvSpec(kind=fields.get("env", environments.DEFAULT), options=env_options),
                   telemetry_interval_s=fields.get("telemetry_interval_s", 0.1), timeout_s=fields.get("timeout_s"),
                   fresh=fields.get("fresh", "auto"))

    if "arms" not in top:
        raise UsageError(f"{path}:{doc.line}: missing key 'arms' (a list of at least two mappings, each with a name)")
    arms_raw, arms_loc = top["arms"]
    if not isinstance(arms_raw, _List):
        raise UsageError(f"{arms_loc}: arms must be a list of mappings, e.g. - {{name: gpu, device: cuda}}")
    raw_arms = []
    for item, line in zip(arms_raw, arms_raw.lines):
        if not isinstance(item, _Map):
            raise UsageError(f"{path}:{line}: an arm is a mapping with a name, e.g. {{name: cpu, device: cpu}}")
        if item.get("name") in (None, ""):
            raise UsageError(f"{path}:{line}: this arm has no name")
        if not isinstance(item["name"], str):
            raise UsageError(f"{path}:{item.lines['name']}: an arm's name is a word, e.g. name: gpu")
        overrides = {k: v for k, v in item.items() if k != "name"}
        raw_arms.append((str(item["name"]), overrides, f"{path}:{line}",
                         {k: f"{path}:{item.lines[k]}" for k in overrides}))
    if not raw_arms:
        raise UsageError(f"{arms_loc}: arms is empty: a comparison needs at least two arms")
    arms = build_arms(workload, base, raw_arms)
    if opts["max_trials"] is not None and not opts["until_confident"]:
        raise UsageError(f"{top['max_trials'][1]}: max_trials applies with until_confident: true")
    if opts["until_confident"] and opts["max_trials"] is None:
        opts["max_trials"] = max(DEFAULT_MAX_TRIALS, opts["trials"])
    exp = Experiment(name=opts["name"] or path.stem, base=base, arms=arms, trials=opts["trials"], seed=opts["order_seed"],
                     kind="compare", meta=ExperimentMeta(margin=opts["margin"], confidence=opts["confidence"],
                                                         file=str(path), description=opts["description"]))
    return Study(exp, margin=opts["margin"], confidence=opts["confidence"], until_confident=opts["until_confident"],
                 max_trials=opts["max_trials"], retries=opts["retries"], source=str(path))


def _as_key(exc: UsageError) -> str:
    """'--batch-size: ...' -> 'batch_size: ...': a file's keys are spelt with underscores."""
    text = str(exc)
    if text.startswith("--"):
        option, sep, rest = text.partition(":")
        if sep and " " not in option:
            return option[2:].replace("-", "_") + ":" + rest
    return text


def _default_device() -> str:
    from gpuvs import fingerprint

    return "cuda" if fingerprint.gpu_count() > 0 else "cpu"
