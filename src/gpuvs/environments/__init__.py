"""Environments: where a worker runs. This registry owns the kinds.

Each module that registers an Environment subclass (`@register`) is one kind, declaring its options and checks.
Nothing else in gpuvs names the kinds one by one, so a new engine (Slurm, say) is one new module.
Modules import no heavy or optional library at module level, so that discovering the kinds stays cheap."""

from __future__ import annotations

from typing import Any

from gpuvs.environments.environment import Environment, Launched, WorkerStream
from gpuvs.errors import UsageError
from gpuvs.params import Param
from gpuvs.registry import Registry
from gpuvs.spec import EnvSpec

__all__ = ["Environment", "Launched", "WorkerStream", "register", "get", "kind", "names", "params", "param", "option_keys",
           "env_spec", "options_for", "check_options", "label", "fingerprint_fields", "explained", "local"]

DEFAULT = EnvSpec().kind  # the kind used where none is named (host)
# after discovery, _union refuses two kinds that declare one option differently, at once
_kinds: Registry[type[Environment]] = Registry(__name__, __path__, "environment", lambda cls: cls.kind,
                                               after=lambda: _union())
_REGISTRY = _kinds.classes
register = _kinds.register


def names() -> list[str]:
    """Kinds, in their declared order (host first)."""
    _kinds.discover()
    return [k for k, _ in sorted(_REGISTRY.items(), key=lambda kv: (kv[1].rank, kv[0]))]


def kind(name: str) -> type[Environment]:
    _kinds.discover()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UsageError(f"unknown environment {name!r}; known: {', '.join(names())}") from None


def get(env: EnvSpec) -> Environment:
    return kind(env.kind)(env.options)


# -- options --------------------------------------------------------------------------------------

def _union() -> dict[str, Param]:
    """One Param per option name across kinds (the first kind's, by order); types must agree."""
    out: dict[str, Param] = {}
    owner: dict[str, str] = {}
    for name in names():
        for p in _REGISTRY[name].params:
            first = out.get(p.name)
            if first is None:
                out[p.name], owner[p.name] = p, name
            elif (first.type, first.multiple) != (p.type, p.multiple):
                raise RuntimeError(f"option {p.name!r} is declared as {first.type.__name__} by environment "
                                   f"{owner[p.name]} and as {p.type.__name__} by {name}")
    return out


def takers(option: str) -> list[str]:
    """The kinds that take an option, in order."""
    return [k for k in names() if any(p.name == option for p in _REGISTRY[k].params)]


def env_param() -> Param:
    return Param("env", str, DEFAULT, "where the worker runs: " + "; ".join(
        f"{k}: {kind(k).summary}" for k in names()), choices=tuple(names()))


def params() -> tuple[Param, ...]:
    """Every environment option, `--env` first: the group the command line parses."""
    _kinds.discover()
    return (env_param(),) + tuple(_union().values())


def param(option: str) -> Param | None:
    """The Param of an environment option by name (None if no kind takes it)."""
    _kinds.discover()
    return _union().get(option)


def option_keys() -> tuple[str, ...]:
    """EnvSpec.options keys: every kind's option names and internal keys. An arm or an experiment
    file that sets one of these changes where the worker runs, not what it runs."""
    _kinds.discover()
    keys = list(_union())
    for name in names():
        keys += [k for k in _REGISTRY[name].internal_keys if k not in keys]
    return tuple(keys)


def options_for(kind_name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The options of `options` that a kind takes: what an arm that switches to that kind keeps of the
    experiment's own (a file's top-level --image reaches its container and pod arms, not its host arm)."""
    cls = kind(kind_name)
    own = {p.name for p in cls.params} | set(cls.internal_keys)
    return {k: v for k, v in options.items() if k in own}


def check_options(kind_name: str, options: dict[str, Any], cli: bool = True) -> None:
    """Refuse an option that the kind does not take, naming the kinds that do. `cli`: spell options
    as on the command line (--cpus, --env container), else as in a file (cpus, env container)."""
    cls = kind(kind_name)
    own = {p.name for p in cls.params} | set(cls.internal_keys)
    for key in options:
        if key in own:
            continue
        who = takers(key)
        shown = ("--" + key.replace("_", "-")) if cli else key
        env = "--env " if cli else "env "
        if not who:
            raise UsageError(f"{shown} is not an environment option")
        also = f" ({', '.join(env + w for w in who[1:])} takes it too)" if len(who) > 1 else ""
        raise UsageError(f"{shown} applies to {env}{who[0]}, not to {cls.noun or cls.kind}{also}")


def env_spec(values: dict[str, Any]) -> EnvSpec:
    """EnvSpec from the checked values of params() (as the command line gives them, defaults filled):
    the kind's own options are checked again by its own Params; an option it does not take is refused
    unless left at its default; values None, [] and False are left out."""
    kind_name = values.get("env") or DEFAULT
    cls = kind(kind_name)
    own = {p.name: p for p in cls.params}
    union = _union()
    options: dict[str, Any] = {}
    foreign: dict[str, Any] = {}
    for key, value in values.items():
        if key == "env" or value in (None, [], False):
            continue
        if key in own:
            options[key] = own[key].coerce(value)
        elif key in union and value == union[key].default:
            continue  # another kind's default, not something the user asked for
        else:
            foreign[key] = value
    check_options(kind_name, foreign, cli=True)
    return EnvSpec(kind=kind_name, options=options)


# -- labels and fingerprints ----------------------------------------------------------------------

def label(env: EnvSpec | dict[str, Any]) -> str:
    """A short name of where a spec runs ("host", "container:podman:/:O", "pod:IMAGE")."""
    if isinstance(env, dict):
        env = EnvSpec(kind=env.get("kind", DEFAULT), options=env.get("options") or {})
    _kinds.discover()
    cls = _REGISTRY.get(env.kind)
    return cls.label(env.options) if cls else env.kind


def fingerprint_fields() -> tuple[tuple[str, str], ...]:
    """(key, label) of the fingerprint fields the kinds add, in kind order, without repeats."""
    out: list[tuple[str, str]] = []
    for name in names():
        out += [f for f in _REGISTRY[name].fingerprint_fields if f not in out]
    return tuple(out)


def explained(varied: set[str], kinds: set[str]) -> set[str]:
    """Fingerprint fields whose difference between arms is explained by what the arms vary: `varied`
    holds the keys the arms override, `kinds` the kinds they run in. An option's entry in a kind's
    `explains` applies when an arm varies that option; the entry "env" applies when the arms vary
    the environment and one of them runs in that kind. "*" stands for every key field."""
    from gpuvs.probes import fingerprint

    out: set[str] = set()
    for name in names():
        for key, fields in _REGISTRY[name].explains.items():
            hit = ("env" in varied and name in kinds) if key == "env" else key in varied
            if hit:
                out |= set(fingerprint.KEY_FIELDS) if "*" in fields else set(fields)
    return out


def local(kind_name: str) -> bool:
    """True where the kind's worker runs on this machine."""
    _kinds.discover()
    cls = _REGISTRY.get(kind_name)
    return cls.local if cls else True
