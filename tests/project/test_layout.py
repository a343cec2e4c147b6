"""The shape of the house: no import cycles, no import that points up, and module docstrings of five lines at most.

The import graph of src/gpuvs is read with `ast`: every import statement, at module level or inside a function.
So a cycle hidden in a function-level import counts as a cycle."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

# Where a module may not import from (prefixes; a prefix names a package and everything in it).
STATISTICS = ("gpuvs.analysis.stats", "gpuvs.analysis.family", "gpuvs.analysis.sequential", "gpuvs.sharing.share_stats", "gpuvs.fleet.assess.node_verdicts")
ENTRY_POINTS = ("gpuvs.__main__",)  # `python -m gpuvs`: the top of the house, it starts the command line
COMMANDS = "gpuvs.cli.commands"  # the package of command modules, one per command, found by name

# The house, from the ground up (docs/internals.md, "The floors"): a module may import only from its own floor
# or below, and no two packages import each other. Each entry is a package (or one of the few modules at the
# top); a floor may hold several that do not import each other.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("gpuvs", "gpuvs.errors", "gpuvs.events", "gpuvs.pipequeue", "gpuvs.registry", "gpuvs.safetext", "gpuvs.spawn"),  # the shared vocabulary
    ("gpuvs.contain",),  # a job's whole process tree held (spawn's process groups, a subreaper, a cgroup)
    ("gpuvs.params", "gpuvs.spec"),
    ("gpuvs.probes", "gpuvs.store", "gpuvs.kube"),  # what a machine is; what is kept; the cluster's client
    ("gpuvs.nlp",),
    ("gpuvs.serve",),
    ("gpuvs.environments",),  # where a worker runs (host, container, pod/)
    ("gpuvs.workloads",),  # what it runs (command/ among them)
    ("gpuvs.analysis",),  # statistics and verdicts over stored records
    ("gpuvs.trial",),  # plan, runner, launch, zygote, worker
    ("gpuvs.validate", "gpuvs.sharing", "gpuvs.fleet"),  # what is built on trials
    ("gpuvs.report",),  # every table, page and picture
    ("gpuvs.agent",),  # the in-cluster service: calls the library
    ("gpuvs.cli",),  # parses, calls the library, renders through report/
    ("gpuvs.__main__",),  # the entry point
)


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Every module of the package at `root`: dotted name -> (file, whether it is a package's __init__)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if package else parts)] = (path, package)
    return out


def _loads_its_modules(tree: ast.AST, registries: bool = True) -> int | None:
    """The line where a package's __init__ imports every module of itself by name: importlib.import_module over
    pkgutil.iter_modules(__path__), as gpuvs.cli's does, or a gpuvs.registry.Registry made over its own __path__
    (`Registry(__name__, __path__, ...)`: discover() imports every module of the package, as the workloads and
    environments do); else None."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    own_path = [c for c in calls if any(isinstance(a, ast.Name) and a.id == "__path__" for a in c.args)]
    walks_itself = any(isinstance(c.func, ast.Attribute) and c.func.attr == "iter_modules" for c in own_path)
    loads = [c.lineno for c in calls if isinstance(c.func, ast.Attribute) and c.func.attr == "import_module"]
    if walks_itself and loads:
        return loads[0]
    if not registries:
        return None
    registries = [c.lineno for c in own_path if isinstance(c.func, ast.Name) and c.func.id == "Registry"]
    return registries[0] if registries else None


def import_graph(root: Path, registries: bool = True) -> dict[str, dict[str, int]]:
    """module -> {imported name -> line}: names inside the package are resolved to the module they name
    (`from gpuvs.x import y` is gpuvs.x.y where that is a module, else gpuvs.x); names outside it (rich,
    torch) are kept as their top-level name. A package that loads every module of itself by name
    imports each of them; with `registries`, so does one whose Registry discovers them (when first asked: the
    modules import the package's `register` back, by design, so the cycle check leaves these edges out)."""
    mods = modules(root)
    top = root.name

    def inside(name: str) -> str:
        while name not in mods and "." in name:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, dict[str, int]] = {}
    for name, (path, package) in mods.items():
        here = name if package else name.rpartition(".")[0]
        edges: dict[str, int] = {}
        tree = ast.parse(path.read_text(), str(path))
        line = _loads_its_modules(tree, registries) if package else None
        if line is not None:
            for other in mods:
                if other.rpartition(".")[0] == name:
                    edges[other] = line
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here
                    for _ in range(node.level - 1):
                        base = base.rpartition(".")[0]
                    target = f"{base}.{node.module}" if node.module else base
                else:
                    target = node.module or ""
                targets = [f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target for a in node.names]
            for t in targets:
                resolved = inside(t) if t.split(".")[0] == top else t.split(".")[0]
                if resolved != name:
                    edges.setdefault(resolved, node.lineno)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(w for w in graph[start] if w in graph))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(x for x in graph[w] if x in graph)))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def upward(graph: dict[str, dict[str, int]]) -> list[str]:
    """Every import that breaks a layering rule, as 'module:line imports target (rule)'."""
    rules = [
        (lambda m: not _under(m, "gpuvs.cli") and m not in ENTRY_POINTS, ("gpuvs.cli",),
         "only the command line and the entry point import the command line"),
        (lambda m: any(_under(m, s) for s in STATISTICS), ("gpuvs.report", "gpuvs.cli", "rich"),
         "statistics never import rendering or the command line"),
        (lambda m: _under(m, "gpuvs.report"), ("gpuvs.cli",), "rendering never imports the command line"),
    ]
    bad = []
    for module, edges in graph.items():
        for target, line in edges.items():
            for applies, banned, why in rules:
                if applies(module) and any(_under(target, b) for b in banned):
                    bad.append(f"{module}:{line} imports {target} ({why})")
        if _under(module, COMMANDS) and module != COMMANDS:  # one module per command: they share nothing directly
            for target, line in edges.items():
                if _under(target, COMMANDS) or target == "gpuvs.cli":
                    bad.append(f"{module}:{line} imports {target} (a command module imports neither another "
                               "command nor the dispatcher: what commands share is in cli/common.py, cli/options.py)")
        if module == "gpuvs.params":  # the option schema of the whole project: neutral
            for target, line in edges.items():
                if _under(target, "gpuvs") and target != "gpuvs.errors":
                    bad.append(f"{module}:{line} imports {target} (the option schema imports only gpuvs.errors)")
    return bad


def test_no_import_cycles():
    graph = import_graph(SRC / "gpuvs", registries=False)
    assert len(graph) > 50 and "gpuvs.sharing.share_run" in graph["gpuvs.cli.commands.share"]  # the graph was read
    # the commands package loads every command module by name: the graph has those edges too
    commands = {m for m in graph if m.startswith(COMMANDS + ".")}
    assert len(commands) >= 14 and set(graph[COMMANDS]) >= commands and COMMANDS in graph["gpuvs.cli"]
    assert cycles(graph) == []


def test_no_import_points_up():
    graph = import_graph(SRC / "gpuvs")
    assert "gpuvs.analysis.stats" in graph["gpuvs.sharing.share_stats"]
    assert upward(graph) == []


def room(module: str, floors=FLOORS) -> str | None:
    """The declared entry a module belongs to (the longest that holds it), or None."""
    names = [n for floor in floors for n in floor if n != "gpuvs"]
    held = [n for n in names if _under(module, n)]
    if held:
        return max(held, key=len)
    return "gpuvs" if module == "gpuvs" else None


def floor_of(entry: str, floors=FLOORS) -> int:
    return next(i for i, floor in enumerate(floors) if entry in floor)


def against_the_order(graph: dict[str, dict[str, int]], floors=FLOORS) -> list[str]:
    """Every module outside the declared rooms, every import of a module from a higher floor (or from a room of its
    own floor: rooms of one floor do not import each other), and every pair of rooms that import each other."""
    bad = []
    rooms: dict[tuple[str, str], str] = {}
    for module, edges in graph.items():
        here = room(module, floors)
        if here is None:
            bad.append(f"{module} is in no declared room (add it to FLOORS, or move it into a package)")
            continue
        for target, line in edges.items():
            there = room(target, floors) if target.split(".")[0] == "gpuvs" else None
            if there is None or there == here:
                continue
            rooms.setdefault((here, there), f"{module}:{line}")
            if floor_of(there, floors) >= floor_of(here, floors):
                bad.append(f"{module}:{line} imports {target} ({there} is not below {here})")
    for (a, b), where in sorted(rooms.items()):
        if a < b and (b, a) in rooms:
            bad.append(f"{a} and {b} import each other ({where}; {rooms[(b, a)]})")
    return bad


def test_packages_keep_their_declared_order():
    graph = import_graph(SRC / "gpuvs")
    # the graph models registry discovery: the workloads' __init__ imports every workload module
    assert "gpuvs.workloads.command" in graph["gpuvs.workloads"]
    assert "gpuvs.environments.pod" in graph["gpuvs.environments"]
    assert against_the_order(graph) == []


def test_few_modules_are_left_at_the_top():
    """The top holds the shared vocabulary (pipequeue: a job's output queue, used below and above environments/)
    and the entry point; the worker, the probe and the zygote run from gpuvs.trial."""
    top = sorted(p.stem for p in (SRC / "gpuvs").glob("*.py"))
    assert top == ["__init__", "__main__", "contain", "errors", "events", "params", "pipequeue", "registry",
                   "safetext", "spawn", "spec"]


def test_private_modules_are_imported_only_inside_their_package():
    """A module named with a leading "_" (workloads/_timed.py: not a plug-in) is its package's own; one that another
    package imports is named without it (workloads/barrier.py, which sharing/ imports, skipped by the registry)."""
    across = []
    for module, edges in import_graph(SRC / "gpuvs").items():
        for target, line in edges.items():
            parts = target.split(".")
            private = [i for i, part in enumerate(parts) if part.startswith("_") and not part.startswith("__")]
            if private and not _under(module, ".".join(parts[:private[0]])):
                across.append(f"{module}:{line} imports {target}")
    assert across == []


def test_commands_build_no_tables():
    """Every table is made in report/ from typed results; the command line's one help renderer (cli/help.py) is the
    only module under gpuvs.cli that imports rich's tables."""
    graph = import_graph(SRC / "gpuvs")
    building = sorted(m for m, edges in graph.items() if _under(m, "gpuvs.cli") and m != "gpuvs.cli.help"
                      and "rich" in edges and "Table(" in modules(SRC / "gpuvs")[m][0].read_text())
    assert building == []


# What a command module may not import, as (module, name): the feature's run_x opens the store and builds the
# runners (one seam per feature, issue 46). Importing the module itself counts too.
ORCHESTRATION = {("gpuvs.store.db", "Store"), ("gpuvs.trial.runner", "Runner")}
# Command modules that still import them, each with why; the test fails when one no longer needs it, so the
# set only shrinks.
ORCHESTRATING_COMMANDS = {
    "results",  # Store in the annotations of its helpers (the store is opened by common.open_store)
}


def orchestration_imports(path: Path, package: str) -> list[str]:
    """'line: module.name' for each import of ORCHESTRATION in the file (at any depth, relative ones resolved
    against `package`); importing the whole module counts, since its Store or Runner is then in reach."""
    found = []
    modules_of = {m for m, _ in ORCHESTRATION}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: {a.name}" for a in node.names if a.name in modules_of]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            for a in node.names:
                if (module, a.name) in ORCHESTRATION or f"{module}.{a.name}" in modules_of:
                    found.append(f"{node.lineno}: {module}.{a.name}")
    return found


def test_commands_leave_the_store_and_the_runner_to_the_library():
    """A command parses, builds its feature's request, calls its run_x and renders: none opens the store or
    builds a Runner itself, but those allowed (ORCHESTRATING_COMMANDS), and each of those still does."""
    folder = SRC / "gpuvs" / "cli" / "commands"
    found = {p.stem: orchestration_imports(p, COMMANDS) for p in sorted(folder.glob("*.py"))}
    assert len(found) >= 14 and "share" in found  # the command modules were read
    assert {m: lines for m, lines in found.items() if lines and m not in ORCHESTRATING_COMMANDS} == {}
    assert sorted(m for m in ORCHESTRATING_COMMANDS if not found.get(m)) == []  # an exemption no longer needed


def test_orchestration_imports_are_found_in_every_spelling(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("from gpuvs.store.db import Store, StoreError\nimport gpuvs.trial.runner\n"
                 "def g():\n    from ...trial.runner import Runner\n    from gpuvs.store import db\n"
                 "from gpuvs.trial.runner import TrialResult\n")
    assert orchestration_imports(f, COMMANDS) == ["1: gpuvs.store.db.Store", "2: gpuvs.trial.runner",
                                                  "4: gpuvs.trial.runner.Runner", "5: gpuvs.store.db"]


def test_checker_finds_a_cycle_and_an_upward_import(tmp_path):
    """The checks above can fail: a small package with a function-level cycle (a -> b -> c -> a), a
    relative import, a statistics module importing a renderer, a library module importing the CLI, and
    command modules importing another command and the dispatcher."""
    pkg = tmp_path / "gpuvs"
    files = {
        "__init__.py": "",
        "errors.py": "",
        "params.py": "from gpuvs import errors\n",
        "a.py": "from gpuvs import b\n",
        "b.py": "from .c import thing\n",
        "c.py": "def f():\n    import gpuvs.a\n",
        "analysis/__init__.py": "",
        "analysis/stats.py": "def show():\n    from gpuvs.report.terminal import fmt\n",
        "store/__init__.py": "",
        "store/db.py": "from gpuvs.cli import app\n",
        "report/__init__.py": "",
        "report/terminal.py": "import rich\n",
        "cli/__init__.py": "import importlib, pkgutil\napp = None\n"
                           "for m in pkgutil.iter_modules(__path__):\n    importlib.import_module(m.name)\n",
        "cli/cmd.py": "from gpuvs.cli import app\n",
        "cli/common.py": "",
        "cli/commands/__init__.py": "import importlib, pkgutil\n"
                                    "for m in pkgutil.iter_modules(__path__):\n    importlib.import_module(m.name)\n",
        "cli/commands/one.py": "from gpuvs.cli import common\nfrom gpuvs.cli.commands import two\n",
        "cli/commands/two.py": "def main():\n    from gpuvs.cli import main\n",
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    graph = import_graph(pkg)
    # cli/__init__ loads its modules (the commands package among them), which load theirs: cmd and two,
    # importing back up, close one cycle through the package
    assert sorted(cycles(graph)) == [["gpuvs.a", "gpuvs.b", "gpuvs.c"],
                                     ["gpuvs.cli", "gpuvs.cli.cmd", "gpuvs.cli.commands", "gpuvs.cli.commands.one",
                                      "gpuvs.cli.commands.two"]]
    assert sorted(upward(graph)) == [
        "gpuvs.analysis.stats:2 imports gpuvs.report.terminal (statistics never import rendering or the command line)",
        "gpuvs.cli.commands.one:2 imports gpuvs.cli.commands.two (a command module imports neither another "
        "command nor the dispatcher: what commands share is in cli/common.py, cli/options.py)",
        "gpuvs.cli.commands.two:2 imports gpuvs.cli (a command module imports neither another "
        "command nor the dispatcher: what commands share is in cli/common.py, cli/options.py)",
        "gpuvs.store.db:1 imports gpuvs.cli (only the command line and the entry point import the command line)",
    ]
    (pkg / "params.py").write_text("from gpuvs import errors\nfrom gpuvs.store import db\n")
    assert any("gpuvs.params:2 imports gpuvs.store.db" in line for line in upward(import_graph(pkg)))
    # the declared order: the store (floor 1) imports the command line (floor 3) and the report package imports
    # the analysis package, which imports it back; a/b/c are in no room
    floors = (("gpuvs", "gpuvs.errors", "gpuvs.params"), ("gpuvs.store",), ("gpuvs.analysis", "gpuvs.report"),
              ("gpuvs.cli",))
    (pkg / "report" / "terminal.py").write_text("import rich\nfrom gpuvs.analysis import stats\n")
    found = against_the_order(import_graph(pkg), floors)
    assert "gpuvs.store.db:1 imports gpuvs.cli (gpuvs.cli is not below gpuvs.store)" in found
    assert "gpuvs.analysis.stats:2 imports gpuvs.report.terminal (gpuvs.report is not below gpuvs.analysis)" in found
    assert any(line.startswith("gpuvs.analysis and gpuvs.report import each other") for line in found)
    assert "gpuvs.a is in no declared room (add it to FLOORS, or move it into a package)" in found


@pytest.mark.parametrize("module", ["gpuvs.sharing.share_stats", "gpuvs.analysis.stats", "gpuvs.params"])
def test_low_modules_import_no_renderer_at_run_time(module):
    """What the graph says, checked in a fresh interpreter: importing a statistics module or the option
    schema loads no renderer, no command line and no rich."""
    import subprocess
    import sys

    code = (f"import sys, {module}; bad = [m for m in sys.modules if m.split('.')[0] == 'rich' or "
            "m.startswith(('gpuvs.report', 'gpuvs.cli'))]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_entry_points_environments_start_run():
    """`python -m gpuvs.trial.worker`, `gpuvs.trial.inside` and `gpuvs.trial.zygote` (what hosts, images and pods
    start): a worker runs a trial and reports it, the probe prints what it sees, the zygote refuses to start
    without its socket."""
    import json
    import subprocess
    import sys

    from gpuvs.environments.host import worker_env
    from gpuvs.spec import RunSpec

    env = {**worker_env(RunSpec(workload="selftest", device="cpu", params={"steps": 2})), "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-m", "gpuvs.trial.worker"], capture_output=True, text=True, timeout=120,
                         env=env)
    kinds = [json.loads(line)["type"] for line in out.stdout.splitlines() if line.startswith("{")]
    assert out.returncode == 0 and kinds.count("sample") >= 2 and kinds[-1] == "summary", out.stderr
    probe = subprocess.run([sys.executable, "-m", "gpuvs.trial.inside", "--probe"], capture_output=True, text=True,
                           timeout=120, env={**env, "GPUVS_SPEC": ""})
    assert probe.returncode == 0 and "python" in json.loads(probe.stdout.strip().splitlines()[-1]), probe.stderr
    z = subprocess.run([sys.executable, "-m", "gpuvs.trial.zygote"], capture_output=True, text=True, timeout=120,
                       env=env)
    assert z.returncode != 0 and "--connect SOCKET is required" in z.stderr, z.stderr


def test_every_module_named_to_run_exists():
    """Each `python -m gpuvs.X` in the sources, docs, manifests and scripts names a module that exists: a command
    line that names a removed module fails only where it is started (an image, a pod)."""
    import importlib.util
    import re

    ROOT = SRC.parent
    named = re.compile(r"""-m["',\s]+(gpuvs(?:\.[A-Za-z_][A-Za-z0-9_]*)+)""")
    found: dict[str, set[str]] = {}
    files = [ROOT / "README.md", ROOT / "Containerfile"]
    for folder in ("src", "docs", "deploy", "overlays", "scripts", "benchmarks", "experiments"):
        files += [p for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix in ("", ".py", ".md", ".yaml",
                                                                                       ".yml", ".sh", ".toml")]
    for path in files:
        if path.is_relative_to(ROOT / "benchmarks" / "log"):  # history: the modules as they were named then
            continue
        for name in named.findall(path.read_text(errors="replace")):
            found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    assert "gpuvs.trial.worker" in found and "gpuvs.trial.inside" in found and "gpuvs.trial.zygote" in found
    missing = {name: sorted(where) for name, where in found.items() if importlib.util.find_spec(name) is None}
    assert missing == {}


def test_one_refusal_of_an_unknown_option_outside_the_command_line():
    """A library caller's mapping of options is checked by params.refuse_unknown alone (one wording); the command
    line's words by cli/parser.py."""
    said = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                  if re.search(r"unknown option|has no option", p.read_text()) and "cli" not in p.relative_to(SRC).parts)
    assert said == ["gpuvs/params.py"], said


def long_docstrings(paths, most: int = 5) -> list[str]:
    """'path: N lines' for each module whose docstring (ast.get_docstring) is missing or longer than `most` lines."""
    bad = []
    for path in paths:
        doc = ast.get_docstring(ast.parse(path.read_text(), str(path)))
        lines = len(doc.splitlines()) if doc else 0
        if not 0 < lines <= most:
            name = path.relative_to(SRC.parent) if path.is_relative_to(SRC.parent) else path
            bad.append(f"{name}: {lines} lines" if lines else f"{name}: no docstring")
    return bad


def python_modules() -> list[Path]:
    """Every module of src/gpuvs, tests/ (its packages too), benchmarks/*.py and the Python scripts of scripts/."""
    root = SRC.parent
    scripts = [p for p in sorted((root / "scripts").iterdir())
               if p.is_file() and p.read_text(errors="replace").startswith("#!/usr/bin/env python")]
    return [*sorted((SRC / "gpuvs").rglob("*.py")), *sorted((root / "tests").glob("*.py")), *sorted((root / "tests").glob("*/*.py")),
            *sorted((root / "benchmarks").glob("*.py")), *scripts]


def test_every_module_says_what_it_is_for_in_five_lines_at_most():
    """A module's docstring says what the module is for (issue 47); the why of a line is a comment at that line."""
    modules = python_modules()
    assert len(modules) > 300 and SRC / "gpuvs" / "fleet" / "assess" / "drift.py" in modules  # the modules were found
    bad = long_docstrings(modules)
    assert bad == [], "module docstrings missing or over 5 lines:\n" + "\n".join(bad)


def test_the_docstring_check_names_the_long_and_the_missing(tmp_path):
    (tmp_path / "pkg").mkdir()
    files = {"short.py": '"""One line."""\n', "five.py": '"""One.\n\n3\n4\n5"""\n',
             "six.py": '"""One.\n\n3\n4\n5\n6"""\n', "none.py": "import os\n"}
    for name, text in files.items():
        (tmp_path / "pkg" / name).write_text(text)
    paths = [tmp_path / "pkg" / name for name in files]
    assert [line.rsplit("/", 1)[-1] for line in long_docstrings(paths)] == ["six.py: 6 lines", "none.py: no docstring"]


def repeated_names(src: Path) -> list[str]:
    """Module names used twice, or named like a package: what a reader mistakes for another. cli/commands/ and
    report/ are exempt, each module there named after the feature it runs or renders."""
    packages = {p.name for p in src.rglob("*") if p.is_dir() and (p / "__init__.py").exists()}
    seen: dict[str, list[str]] = {}
    for p in src.rglob("*.py"):
        rel = p.relative_to(src)
        if p.name == "__init__.py" or rel.parts[1:3] == ("cli", "commands") or rel.parts[1] == "report":
            continue
        seen.setdefault(p.stem, []).append(str(rel))
    return sorted([f"{name}: {', '.join(sorted(where))}" for name, where in seen.items() if len(where) > 1]
                  + [f"{name}: {where[0]} is named like the package {name}/" for name, where in seen.items()
                     if name in packages and len(where) == 1])


def test_no_module_name_is_used_twice_or_named_like_a_package():
    assert repeated_names(SRC) == []


def test_the_name_check_finds_a_twin_and_a_module_named_like_a_package(tmp_path):
    for rel in ("gpuvs/__init__.py", "gpuvs/a/__init__.py", "gpuvs/a/run.py", "gpuvs/b/__init__.py", "gpuvs/b/run.py",
                "gpuvs/b/a.py", "gpuvs/cli/commands/run.py", "gpuvs/report/b.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text('"""x"""\n')
    assert repeated_names(tmp_path) == ["a: gpuvs/b/a.py is named like the package a/", "run: gpuvs/a/run.py, gpuvs/b/run.py"]


def test_tests_sit_beside_their_package():
    """Each test module is in the folder of the package it tests (tests/fleet/, tests/trial/...), or tests/project/
    for the project as a whole; the folder names a package of gpuvs."""
    tests = SRC.parent / "tests"
    loose = sorted(p.name for p in tests.glob("test_*.py"))
    assert loose == [], f"test modules outside a package's folder: {loose}"
    folders = {p.parent.name for p in tests.glob("*/test_*.py")}
    packages = {p.name for p in (SRC / "gpuvs").iterdir() if (p / "__init__.py").exists()}
    assert folders - packages == {"project"} and len(folders) > 10, folders - packages


def test_one_trial_loop():
    """Every study starts, reads and stops its trials through trial.runner.Flight: no other module makes a
    LiveTrial, so no loop of its own can skip a timeout, a Ctrl-C or a refused store write."""
    makers = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if re.search(r"\bLiveTrial\(", p.read_text()))
    assert makers == ["gpuvs/trial/runner.py"], makers
    users = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if re.search(r"\bFlight\(", p.read_text()))
    assert {"gpuvs/fleet/execute/fleet_run.py", "gpuvs/fleet/execute/pergpu.py", "gpuvs/sharing/group.py",
            "gpuvs/trial/runner.py"} <= set(users), users
