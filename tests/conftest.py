"""What every test shares: gpuvs run as a process (run_cli, cli), waits, and its processes found by TEST_TAG.

It orders the tests too: the cluster's last, on a worker of their own, then the quiet ones (tests/quiet.py)."""

import os
import resource
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from quiet import turns as quiet_turns

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"

# Every process the tests start (directly or not) inherits this tag in its environment, so a test can
# find anything left running by this test session alone, even while other suites share the machine.
TEST_TAG = uuid.uuid4().hex
os.environ["GPUVS_TEST_TAG"] = TEST_TAG


def gpuvs_env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["COLUMNS"] = "200"
    env.update(extra)
    return env


def run_cli(*args, timeout=600, cwd=None, address_space=None, **env):
    """Run `python -m gpuvs ARGS` for real; returns CompletedProcess with text output. `address_space`
    (bytes) caps the virtual memory of gpuvs and its workers (as `ulimit -v` does), so that an allocation
    too large fails there and then, whatever the machine's overcommit setting."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    timeout = timeout * load_factor()  # stated for an idle machine
    proc = subprocess.Popen([sys.executable, "-m", "gpuvs", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd, env=gpuvs_env(**env),
                            preexec_fn=limit if address_space else None)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:  # a timeout here or pytest-timeout's: SIGTERM, so that gpuvs cleans up (its workers,
        proc.terminate()   # containers and MPS daemon), as subprocess.run's SIGKILL would not let it
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture
def cli(tmp_path):
    def _run(*args, **kw):
        kw.setdefault("cwd", tmp_path)
        return run_cli(*args, **kw)
    return _run


@pytest.fixture
def store_path(tmp_path):
    return tmp_path / "gpuvs.db"


def load_factor() -> float:
    """How many times slower than an idle machine this one is now: the last minute's load average per core,
    between 1 and 4 (GPUVS_TEST_SLOWDOWN fixes it). The budgets the tests wait with are stated for an idle machine and
    stretched by it, so that a machine busy with other work (CI beside other jobs) waits longer instead of failing."""
    fixed = os.environ.get("GPUVS_TEST_SLOWDOWN")
    if fixed:
        return max(1.0, float(fixed))
    return min(4.0, max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1)))


def wait_for(fn, timeout: float, what: str, step: float = 0.2):
    """fn() until it returns something true (returned), every `step` s; fails the test once `timeout` seconds of an
    idle machine have passed: each second of waiting counts 1/load_factor() of a second, so a loaded machine's
    wait stretches (up to 4x) and a hang still ends."""
    spent, last, began = 0.0, time.monotonic(), time.monotonic()
    while True:
        got = fn()
        if got:
            return got
        now = time.monotonic()
        spent, last = spent + (now - last) / load_factor(), now
        assert spent < timeout, f"no {what} within {timeout:.0f} s (idle-machine seconds; {now - began:.0f} s of wall time)"
        time.sleep(step)


def stop_process(proc: subprocess.Popen, timeout: float) -> int | None:
    """SIGTERM, then up to `timeout` s for the process to end: its exit status; None where it did not end and was
    killed (and reaped) instead."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purpose
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


class Pid(int):
    """A PID whose repr names the command, so that a failed 'nothing left' assertion says what was left."""

    def __repr__(self) -> str:
        try:
            cmd = Path(f"/proc/{int(self)}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmd = "?"
        return f"{int(self)} ({cmd.strip()[:160]})"

    __str__ = int.__repr__  # f"/proc/{pid}" stays a path


def _own_resource_tracker(proc: Path) -> bool:
    """This test process's multiprocessing resource tracker: started once by the first spawn a test makes in-process
    (the agent's library call in a child process, agent/child.py), it lives as long as the test process and ends
    with it; it is not something gpuvs left behind."""
    try:
        cmd = (proc / "cmdline").read_bytes()
        ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return False
    return ppid == os.getpid() and b"multiprocessing.resource_tracker" in cmd


def gpuvs_processes() -> list[int]:
    """PIDs of live processes started (directly or not) by this test session."""
    marker = f"GPUVS_TEST_TAG={TEST_TAG}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                env = (d / "environ").read_bytes()
            except OSError:
                continue
            if marker in env.split(b"\0") and pid_alive(int(d.name)) and not _own_resource_tracker(d):
                out.append(Pid(d.name))
    return out


def missing_part(reason: str) -> None:
    """A real part this test needs is not on this machine: under CI=true that is a failure (a skipped test proves
    nothing, and CI installs every part the suite needs); elsewhere the test is skipped with the reason."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


def require(tool: str, what: str) -> str:
    """The path of a command the test needs (see missing_part)."""
    import shutil

    path = shutil.which(tool)
    if path is None:
        missing_part(f"{what} is needed: `{tool}` is not on PATH")
    return path


def uses_cluster(item) -> bool:
    names = getattr(item, "fixturenames", ())
    return item.get_closest_marker("cluster") is not None or "cluster" in names or "k8s_build" in names


def quiet(item) -> bool:
    return item.get_closest_marker("quiet") is not None


# tryfirst: xdist's own hook turns the xdist_group marks into the groups it schedules by, so they are set before
# it runs (without this, both workers took cluster tests and found each other's pods, containers and load)
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The tests that need the Kubernetes test cluster run last (in their order), so that the rest run while CI still
    builds and starts the cluster in the background (GPUVS_CLUSTER_PENDING: tests/cluster.py); under pyproject's two
    workers they run beside the rest, on a worker of their own. Every test's timeout
    (pytest-timeout's backstop against a hang; 300 s unless marked) is stated for an idle machine and stretched by
    the load at collection (load_factor), the cluster tests' twice as much: they wait on kubelets, pods and images."""
    # the rest first; on the cluster's worker its tests, then the quiet tests of the rest: they run after the
    # cluster's set-up (a cold Kubernetes build is 12 minutes of compiling on both cores) and mostly alone
    items.sort(key=lambda item: (uses_cluster(item) or quiet(item), quiet(item) and not uses_cluster(item)))
    # a worker's own config says dist "no" and loadgroup True (xdist's remote.setup_config)
    if getattr(config.option, "loadgroup", False) or getattr(config.option, "dist", "no") == "loadgroup":
        # two groups, one worker each (pyproject's addopts): the cluster's tests wait for the cluster and then
        # run in order beside the rest; within a group, one test never finds another's pods or containers
        for item in items:
            # a quiet test (tests/quiet.py) runs on the cluster's worker, which alone asks the other to pause
            item.add_marker(pytest.mark.xdist_group("cluster" if uses_cluster(item) or quiet(item) else "local"))
    factor = load_factor()
    default = float(config.getini("timeout") or 300)
    for item in items:
        mark = item.get_closest_marker("timeout")
        base = float(mark.args[0]) if mark and mark.args else float(mark.kwargs.get("timeout", default)) if mark else default
        if base > 0:
            item.add_marker(pytest.mark.timeout(base * factor * (2 if uses_cluster(item) else 1)), append=False)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item):
    """Quiet turns (tests/quiet.py), and .ci/run's background set-up for a cluster test, outside pytest-timeout's
    timer: a paused test's wait is not its own time."""
    import cluster

    if cluster.PENDING and uses_cluster(item):
        cluster.background_setup_ended()
    t = quiet_turns(item.config)
    if t is not None and quiet(item):
        t.take()
    elif t is not None:
        t.wait_turn()
    try:
        yield
    finally:
        if t is not None and quiet(item):
            t.give_back()


def pytest_configure(config):
    """The two workers need xdist's loadgroup to work: on pytest 9.2 it silently stops grouping (pytest-xdist issue
    1386), and the cluster's tests would run on both workers at once."""
    major, minor = (int(x) for x in pytest.__version__.split(".")[:2])
    if getattr(config.option, "dist", "no") == "loadgroup" and (major, minor) >= (9, 2):
        raise pytest.UsageError(f"pytest {pytest.__version__} and xdist's loadgroup do not group tests (pytest-xdist "
                                "issue 1386): install the test extra (pytest<9.2), or run with -n 0")


def pytest_sessionfinish(session):
    t = quiet_turns(session.config)
    if t is not None:
        t.finished()


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI=true a skipped test is a failed one (a skip proves nothing, and CI installs every part the
    suite needs), except tests marked `gpu`: CI has no GPU by design, and their CPU paths run in other tests."""
    outcome = yield
    report = outcome.get_result()
    if _in_ci() and report.skipped and item.get_closest_marker("gpu") is None and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"CI=true and this test was skipped: {report.longrepr}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """The same for a whole module skipped at collection (a module-level importorskip)."""
    outcome = yield
    report = outcome.get_result()
    if _in_ci() and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"CI=true and this module was skipped: {report.longrepr}"


def cell(text: str, first: str) -> dict[str, str]:
    """The table row whose first cell is `first`, as {header: cell}."""
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("┃"))
    names = [h.strip() for h in header.strip("┃").split("┃")]
    row = next(line for line in lines if line.startswith("│") and line.strip("│").split("│")[0].strip() == first)
    return dict(zip(names, [c.strip() for c in row.strip("│").split("│")]))


# The end of a test script run as `python -c`: it lists this process's children (pid, state) and exits 1 when one
# is a zombie (an exited child nobody reaped). The script imports os and sys.
CHILDREN_LEFT = r"""
kids = []
for d in os.listdir("/proc"):
    if d.isdigit():
        try:
            stat = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat[1] == str(os.getpid()):
            kids.append((int(d), stat[0]))
print("children", kids)
sys.exit(1 if any(state == "Z" for _, state in kids) else 0)
"""


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD)


@pytest.fixture(autouse=True)
def _signal_handlers_put_back():
    """gpuvs code run inside the test process (the agent's service, the supervisor, the CLI's main) installs its own
    stop handlers: it must put back what it found, or a later test's Ctrl-C (and a library user's) goes to a handler
    of something long finished (twice in CI, a later test's Ctrl-C to a gpuvs child went unheeded for 10 s). What a
    test leaves changed is put back here and named in the run's warnings summary."""
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    yield
    after = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    left = signal.set_wakeup_fd(wakeup)
    changed = [signal.Signals(s).name for s in STOP_SIGNALS if after[s] is not before[s]]
    for s in STOP_SIGNALS:
        signal.signal(s, before[s])
    if changed or left != wakeup:
        import warnings

        warnings.warn("put back after this test: " + ", ".join(
            [f"the {n} handler {after[signal.Signals[n]]!r}" for n in changed] +
            ([f"signal.set_wakeup_fd({left})"] if left != wakeup else [])), stacklevel=1)
