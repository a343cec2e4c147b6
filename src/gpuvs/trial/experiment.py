"""Comparisons as data: `study` turns an experiment file's mapping into a checked Study around an Experiment.

The command line builds the same mapping from its options (cli/common.py's run_doc), so both are checked alike.
Every problem is one line saying where: `FILE:LINE: what is wrong`, or `--arm #N: arm 'NAME': ...`.
An arm's keys but `name` are overrides (overrides.py); arms share the base's parameters unless they override them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from gpuvs import environments, workloads
from gpuvs.errors import UsageError
from gpuvs.params import Param, did_you_mean
from gpuvs.store.records import ExperimentMeta, LookSchedule
from gpuvs.trial.overrides import COMMAND_KEY, SPEC_FIELDS, OverrideError, Overrides, normalise_key
from gpuvs.trial.runner import Arm, Experiment
from gpuvs.spec import EnvSpec, RunSpec

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
    Param("aa", bool, False, "an A/A run: arms that run exactly alike (two, a and b, where none are given), the "
          "standard check of a measuring setup: its verdict should be no difference"),
)
AA_ARMS = ("a", "b")  # an A/A run's arms where none are given
MAX_ARMS = 256  # arms a comparison may have: each runs every trial, so more is a sweep to split, not one comparison

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



# -- arms -> experiment ---------------------------------------------------------------------------

def parse_arm(text: str) -> tuple[str, dict[str, str]]:
    """'gpu:device=cuda,batch_size=64' -> ('gpu', {'device': 'cuda', 'batch_size': '64'}): cut at every comma,
    quotes or not; a value's own words (argv=) are split later, as a shell splits them (command.ArgvParam)."""
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
    seen: dict[str, str] = {}  # the key as the loader reads it -> as written (batch-size and batch_size are one)
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            # after a key=value, a piece without '=' is most likely the rest of a value that held a comma
            why = ("; an --arm is cut at every comma, quotes or not, so a value cannot hold one: give it in an "
                   "experiment file (--file), e.g. argv: [sh, -c, 'echo a,b']") if overrides else ""
            raise UsageError(f"--arm {name}: expected key=value, got {item!r}{why}")
        key = key.strip()
        first = seen.setdefault(normalise_key(key), key)
        if first is not key:
            also = "" if first == key else f" (as {first!r} and {key!r})"
            raise UsageError(f"--arm {text!r}: key {key!r} is given twice{also}; give each key once")
        overrides[key] = value.strip()
    return name, overrides


def _identity(spec: RunSpec) -> str:
    data = spec.to_dict()
    for k in ("arm", "trial", "run_id", "experiment_id", "launched_at"):
        data.pop(k, None)
    return json.dumps(data, sort_keys=True, default=str)


RawArm = tuple  # (name, raw overrides, where, {key: where of that key})


def build_arms(workload: workloads.Workload, base: RunSpec, raw_arms: list[RawArm], aa: bool = False,
               in_file: bool = False) -> list[Arm]:
    """Checked arms from (name, raw overrides, where, key locations); a location prefixes every
    message ('FILE:LINE' or '--arm #N'). Refuses fewer than two arms, repeated names, bad keys and
    values, and arms that run exactly as another, unless `aa` (an A/A run), which refuses arms that differ;
    the refusals say how to ask for an A/A run or leave it out, in a file (`in_file`) or on the command line."""
    aa_on = "set aa: true (or pass --aa)" if in_file else "pass --aa"
    aa_off = "leave out aa: true" if in_file else "leave out --aa"
    if len(raw_arms) < 2:
        where = raw_arms[0][2] if raw_arms else "compare"
        raise UsageError(f"{where}: a comparison needs at least two arms, got {len(raw_arms)}")
    if len(raw_arms) > MAX_ARMS:
        raise UsageError(f"{raw_arms[MAX_ARMS][2]}: {len(raw_arms)} arms given; a comparison takes at most {MAX_ARMS} "
                         "(split a larger sweep into several comparisons)")
    arms: list[Arm] = []
    seen: dict[str, str] = {}
    runs_as: dict[str, str] = {}  # an arm's identity -> the first arm that runs so: one look-up per arm, not a scan
    probe = Experiment("probe", base, [], seed=0)
    for name, raw, where, key_where in raw_arms:
        if name in seen:
            raise UsageError(f"{where}: arm name {name!r} is used twice (first at {seen[name]})")
        try:
            arm = Arm(name, Overrides.sort(raw, workload))
        except OverrideError as exc:
            raise UsageError(f"{key_where.get(exc.key, where)}: arm {name!r}: {exc}") from None
        spec = probe.spec_for(arm, 0)
        try:
            workload.validate(spec.params, spec.device)
            environments.check_options(spec.env.kind, spec.env.options, cli=False)
        except UsageError as exc:
            raise UsageError(f"{where}: arm {name!r}: {exc}") from None
        identity = _identity(spec)
        other = runs_as.get(identity)
        if other is not None and not aa:
            raise UsageError(f"{where}: arm {name!r} runs exactly as arm {other!r} (at {seen[other]}): "
                             f"arms must differ in something; to compare a setup with itself (an A/A run) "
                             f"{aa_on}")
        if aa and runs_as and other is None:  # an A/A run's arms are all alike: unlike the first is unlike all
            first = arms[0].name
            raise UsageError(f"{where}: arm {name!r} does not run as arm {first!r} (at {seen[first]}): "
                             "an A/A run compares a setup with itself, its arms alike; to compare arms that "
                             f"differ, {aa_off}")
        runs_as.setdefault(identity, name)
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


def workload_name(doc: Mapping[str, Any]) -> str:
    """The workload an experiment file names: its `workload`, else the command workload where it gives `command`."""
    if doc.get("workload") is None and COMMAND_KEY in doc:
        return COMMAND_KEY
    return str(doc.get("workload"))


def top_keys() -> set[str]:
    """The keys an experiment file's top level takes."""
    return ({p.name for p in STUDY_PARAMS} | set(SPEC_FIELDS) | set(environments.option_keys())
            | {"workload", "params", "env", "arms", COMMAND_KEY})


TOP_KEYS = frozenset(top_keys())


def load(path: str | Path, cli: Mapping[str, Any] | None = None,
         device_default: Callable[[EnvSpec], str] | None = None) -> Study:
    """An experiment file as a Study. `cli` holds command-line values that replace the file's top-level ones
    (same keys; its 'params' are merged into the file's)."""
    path = Path(path)
    return study(read_file(path), path=path, cli=cli, device_default=device_default)


def default_device(env: EnvSpec) -> str:
    """The device where none is named: cuda where the environment has a GPU to give (or cannot tell), else cpu."""
    return "cpu" if environments.get(env).gpu_count() == 0 else "cuda"


class _Top:
    """A mapping's top-level keys (file and command line together), each with where it was given: 'FILE:LINE',
    'command line' (a value that replaces a file's), or None for a mapping the command line made itself,
    whose messages are the options' own ('--steps: ...', no place)."""

    def __init__(self, doc: Mapping[str, Any], path: Path | None, cli: Mapping[str, Any]):
        self.path, self.doc = path, doc
        self.values: dict[str, tuple[Any, str | None]] = {}
        self.written: dict[str, str] = {}  # each key as the file wrote it
        allowed = TOP_KEYS
        for key, value in doc.items():
            norm, loc = normalise_key(key), self.line(doc, key)
            if norm == "seed":
                raise UsageError(f"{loc}: 'seed' is ambiguous here: write order_seed for the trial order, or "
                                 "params: {seed: N} for the workload's own seed")
            if norm not in allowed:
                raise UsageError(f"{loc}: unknown key {key!r}{did_you_mean(norm, allowed)}; an experiment file "
                                 f"takes: {', '.join(sorted(allowed))}")
            if norm in self.values:  # timeout and timeout_s, batch-size and batch_size: one key written twice
                raise UsageError(f"{loc}: key {norm!r} is given twice (as {self.written[norm]!r} and {key!r}); "
                                 "give each key once")
            self.values[norm], self.written[norm] = (value, loc), key
        for key, value in cli.items():
            self.values[normalise_key(key)] = (value, "command line")

    def line(self, mapping: Mapping[str, Any], key: str | None = None) -> str | None:
        """'FILE:LINE' of a key of one of the file's mappings (of the mapping itself without a key)."""
        if self.path is None:
            return None
        lines = getattr(mapping, "lines", None)
        number = lines[key] if key is not None and lines is not None and key in lines else getattr(mapping, "line", 1)
        return f"{self.path}:{number}"

    def refuse(self, where: str | None, text: str) -> UsageError:
        return UsageError(text if where is None else f"{where}: {_as_key(text)}")

    def __contains__(self, key: str) -> bool:
        return key in self.values

    def __getitem__(self, key: str) -> tuple[Any, str | None]:
        return self.values[key]


def spec(doc: Mapping[str, Any], device_default: Callable[[EnvSpec], str] | None = None
         ) -> tuple[workloads.Workload, RunSpec]:
    """The checked base spec of a mapping the command line made (`gpuvs run`, fleet, share: no arms)."""
    return _base(_Top(doc, None, {}), device_default)


def study(doc: Mapping[str, Any], path: Path | None = None, cli: Mapping[str, Any] | None = None,
          device_default: Callable[[EnvSpec], str] | None = None) -> Study:
    """The one loader: a mapping as an experiment file holds it (read from `path`, or made by the command line
    when path is None) as a Study, its keys, values and arms checked where they were written (the environment's
    own checks are runner.validate_experiment's, once, before anything starts). `cli` replaces the file's top-level values (its 'params' are merged
    into the file's); `device_default` names the device where neither does (default: the environment's)."""
    cli = dict(cli or {})
    cli_params = dict(cli.pop("params", None) or {})
    top = _Top(doc, path, cli)
    workload, base = _base(top, device_default, cli_params)

    opts: dict[str, Any] = {}
    for p in STUDY_PARAMS:
        if p.name in top:
            value, loc = top[p.name]
            try:
                opts[p.name] = p.coerce(value)
            except UsageError as exc:
                raise top.refuse(loc, str(exc)) from None
        else:
            opts[p.name] = p.default

    aa = opts["aa"]
    if "arms" not in top and aa:
        top.values["arms"] = (_aa_arms(top["aa"][1]), top["aa"][1])
    if "arms" not in top:
        raise UsageError(f"{top.line(doc)}: missing key 'arms' (a list of at least two mappings, each with a name); "
                         "or, to compare a setup with itself (an A/A run), aa: true")
    arms_raw, arms_loc = top["arms"]
    if not isinstance(arms_raw, list):
        raise top.refuse(arms_loc, "arms must be a list of mappings, e.g. - {name: gpu, device: cuda}")
    raw_arms = []
    for i, item in enumerate(arms_raw):
        where = f"{path}:{arms_raw.lines[i]}" if path else f"--arm #{i + 1}"
        if not isinstance(item, dict):
            raise UsageError(f"{where}: an arm is a mapping with a name, e.g. {{name: cpu, device: cpu}}")
        if item.get("name") in (None, ""):
            raise UsageError(f"{where}: this arm has no name")
        if not isinstance(item["name"], str):
            raise UsageError(f"{top.line(item, 'name') or where}: an arm's name is a word, e.g. name: gpu")
        overrides = {k: v for k, v in item.items() if k != "name"}
        raw_arms.append((str(item["name"]), overrides, where, {k: top.line(item, k) for k in overrides} if path else {}))
    if not raw_arms:
        raise top.refuse(arms_loc, "arms is empty: a comparison needs at least two arms")
    arms = build_arms(workload, base, raw_arms, aa=aa, in_file=path is not None)

    # the trial count, settled here once: what was asked, two at least where pairs are added until settled
    trials, until, max_trials = opts["trials"], opts["until_confident"], opts["max_trials"]
    if max_trials is not None and not until:
        where = top["max_trials"][1]
        raise UsageError("--max-trials applies with --until-confident" if where is None else
                         f"{where}: max_trials applies with until_confident: true")
    if until and max_trials is None:
        max_trials = max(DEFAULT_MAX_TRIALS, trials)
    meta = ExperimentMeta(margin=opts["margin"], confidence=opts["confidence"], aa=True if aa else None)
    if path is not None:
        meta.file, meta.description = str(path), opts["description"]
    if until:  # the looks are planned now, so that the stopping rule can spend alpha over them
        trials = max(trials, 2)
        meta.sequential = LookSchedule(first=trials, cap=max(max_trials, trials), step=2)
    name = opts["name"] or (path.stem if path is not None else
                            f"{workload.name}: " + " vs ".join(a.name for a in arms) + (" (A/A)" if aa else ""))
    exp = Experiment(name=name, base=base, arms=arms, trials=trials, seed=opts["order_seed"], kind="compare",
                     meta=meta)
    return Study(exp, margin=opts["margin"], confidence=opts["confidence"], until_confident=until,
                 max_trials=max_trials, retries=opts["retries"], source=None if path is None else str(path))


def _aa_arms(where: str | None) -> _List:
    """An A/A run's arms where none are given: two, named a and b, that override nothing (`where`: the place of
    the aa that asked for them, 'FILE:LINE')."""
    arms = _List({"name": name} for name in AA_ARMS)
    line = int(where.rpartition(":")[2]) if where and where.rpartition(":")[2].isdigit() else 1
    arms.line, arms.lines = line, [line] * len(AA_ARMS)
    return arms


def _base(top: _Top, device_default: Callable[[EnvSpec], str] | None,
          cli_params: Mapping[str, Any] | None = None) -> tuple[workloads.Workload, RunSpec]:
    """The workload and the base spec of a study: its spec fields, environment and parameters, checked."""
    doc = top.doc
    if "workload" not in top and COMMAND_KEY in top:  # `command: [PROGRAM, ARGS...]`: the command workload
        top.values["workload"] = (COMMAND_KEY, top[COMMAND_KEY][1])
    if "workload" not in top:
        raise UsageError(f"{top.line(doc)}: missing key 'workload' (one of: {', '.join(workloads.names())})")
    try:
        workload = workloads.get(str(top["workload"][0]))
    except UsageError as exc:
        raise top.refuse(top["workload"][1], str(exc)) from None
    if COMMAND_KEY in top:
        if not workload.argv_param:
            raise top.refuse(top[COMMAND_KEY][1], f"'{COMMAND_KEY}' is the command workload's command line; "
                             f"{workload.name} takes none")
        command, loc = top.values.pop(COMMAND_KEY)
        if not isinstance(command, list) and not isinstance(command, str):
            raise top.refuse(loc, f"{COMMAND_KEY} is a list of words, e.g. {COMMAND_KEY}: [sysbench, cpu, run]")
        file_command = [(workload.argv_param, command, loc)]  # words after `--` on the command line replace it
    else:
        file_command = []

    env_keys = environments.option_keys()
    placed = {k: v for k, (v, _) in top.values.items() if k in SPEC_FIELDS or k == "env" or k in env_keys}
    try:
        own = Overrides.sort(placed, workload)  # the base's own settings, sorted as an arm's are
    except OverrideError as exc:
        raise top.refuse(top[exc.key][1], str(exc)) from None
    env = EnvSpec(kind=own.env or environments.DEFAULT, options=dict(own.options))
    device = own.fields.get("device") or (device_default or default_device)(env)

    params_raw, params_loc = top["params"] if "params" in top else (None, top.line(doc))
    params_raw = {} if params_raw is None else params_raw
    if not isinstance(params_raw, dict):
        raise top.refuse(params_loc, f"params must be a mapping of {workload.name} parameters (batch_size: 64, ...)")
    given: dict[str, Any] = {}
    sources = ([(k, v, top.line(params_raw, k) if params_loc else None) for k, v in params_raw.items()]
               + file_command + [(k, v, "command line") for k, v in (cli_params or {}).items()])
    in_file: dict[str, str] = {}  # a parameter's name -> as the file's params wrote it
    for key, value, loc in sources:
        try:
            param = workload.param(normalise_key(key))
            if loc not in ("command line", None) and param.name in in_file:
                raise UsageError(f"{param.name}: given twice (as {in_file[param.name]!r} and {key!r}); give it once")
            in_file[param.name] = key
            given[param.name] = param.coerce(value)
        except UsageError as exc:
            raise top.refuse(loc, str(exc)) from None
    try:
        params = workload.validate(given, device)
    except UsageError as exc:
        raise top.refuse(params_loc, str(exc)) from None
    base = RunSpec(workload=workload.name, params=params, device=device, num_gpus=own.fields.get("num_gpus", 1),
                   env=env, telemetry_interval_s=own.fields.get("telemetry_interval_s", 0.1),
                   timeout_s=own.fields.get("timeout_s"), fresh=own.fields.get("fresh", "auto"))
    return workload, base


def _as_key(exc: UsageError) -> str:
    """'--batch-size: ...' -> 'batch_size: ...': a file's keys are spelt with underscores."""
    text = str(exc)
    if text.startswith("--"):
        option, sep, rest = text.partition(":")
        if sep and " " not in option:
            return option[2:].replace("-", "_") + ":" + rest
    return text
