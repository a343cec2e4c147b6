"""hyperfine's `--export-json FILE`, read once the command has exited (hyperfine writes it at the end).

ARG: the file; without one, the FILE after `--export-json` in the command's argv.
A file with several results fails the trial: gpuvs compares one command across arms.
Its metrics (mean_s the headline) are in docs/command.md; times are in seconds whatever hyperfine printed."""

from __future__ import annotations

import json
from typing import Any

from gpuvs.errors import UsageError
from gpuvs.workloads.command.outputs import register
from gpuvs.workloads.command.outputs.parsing import Metric, OutputError, Parser, Reading, number

OPTION = "--export-json"


def export_file(argv: tuple[str, ...]) -> str | None:
    """The FILE of `--export-json FILE` or `--export-json=FILE` in a hyperfine command line."""
    for i, word in enumerate(argv):
        if word == OPTION and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(OPTION + "="):
            return word.split("=", 1)[1]
    return None


@register
class Hyperfine(Parser):
    name = "hyperfine"
    summary = "hyperfine's --export-json file: mean time per run (and median, min, user, system, every run's time)"
    arg = "FILE: the --export-json file (default: the one in the command)"
    reads_files = True

    def __init__(self, arg=None, job=None):
        super().__init__(arg, job)
        file = arg or export_file(self.job.argv)
        if not file:
            raise UsageError("parser hyperfine reads the file of hyperfine's --export-json: the command has none; "
                             "add --export-json FILE to it, or name the file: hyperfine:FILE")
        self.file = file
        where = f"hyperfine's {OPTION} file {file}"
        self.metrics = tuple(Metric(n, "lower", "s", read_from=f"{key!r} in {where}", description=d,
                                                kind="time") for n, key, d in (
            ("mean_s", "mean", "mean time of one run"), ("median_s", "median", "median time of one run"),
            ("min_s", "min", "fastest run"), ("user_s", "user", "mean user CPU time of one run"),
            ("system_s", "system", "mean system CPU time of one run"))) + (
            Metric("time_s", "lower", "s", per_step=True, read_from=f"'times' in {where}",
                   description="each run's time", kind="time"),)
        self.headline = "mean_s"

    def finish(self) -> list[Reading]:
        path = self.job.path(self.file)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise OutputError(f"hyperfine wrote no {OPTION} file at {path}") from None
        except (OSError, ValueError) as exc:
            raise OutputError(f"hyperfine's {OPTION} file {path} cannot be read: {exc}") from None
        results = data.get("results") if isinstance(data, dict) else None
        if not isinstance(results, list) or not results:
            raise OutputError(f"hyperfine's {OPTION} file {path} holds no results")
        if len(results) > 1:
            commands = ", ".join(repr(r.get("command")) for r in results)
            raise OutputError(f"hyperfine's {OPTION} file {path} holds {len(results)} results ({commands}): gpuvs "
                              "compares one command across arms, so give hyperfine one command (no parameter scan)")
        result: dict[str, Any] = results[0]
        at = f"file {path}"

        def value(key: str) -> float:
            if key not in result:
                raise OutputError(f"hyperfine's {OPTION} file {path} has no {key!r}")
            return number(str(result[key]), f"{key!r} in {path}")

        stddev = value("stddev") if result.get("stddev") is not None else None  # null for a single run
        times = [number(str(t), f"'times' in {path}") for t in result.get("times") or []]
        self.info.update(command=result.get("command"), runs=len(times), stddev_s=stddev, max_s=value("max"),
                         exit_codes=result.get("exit_codes"))
        out = [self.reading("mean_s", value("mean"), at, **({"stddev": stddev} if stddev is not None else {}))]
        out += [self.reading(name, value(key), at)
                for name, key in (("median_s", "median"), ("min_s", "min"), ("user_s", "user"), ("system_s", "system"))]
        out += [self.reading("time_s", t, at, step=i) for i, t in enumerate(times, 1)]
        return out
