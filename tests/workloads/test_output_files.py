"""-o FILE of `gpuvs report` and `gpuvs results export`, where it cannot be written.

A folder, a full device (/dev/full), a file nobody may write (/proc/version), a write failing half way.
Each is one line and a non-zero exit, never a traceback.
The report goes to a temporary file renamed into place, so a failed write leaves no partial file."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import golden
from conftest import gpuvs_env

LIMIT = 36 * 1024  # above the store's own files (its 32 KiB WAL index), below the HTML report (about 43 KiB)


def gpuvs(*args, cwd, file_limit: int | None = None) -> subprocess.CompletedProcess:
    def limit():  # a write past `file_limit` bytes fails with EFBIG, as one on a full disk fails with ENOSPC
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))
    return subprocess.run([sys.executable, "-m", "gpuvs", *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env=gpuvs_env(), timeout=120, preexec_fn=limit if file_limit else None)


@pytest.fixture
def store(tmp_path) -> tuple[Path, str]:
    shutil.copy(golden.STORE, tmp_path / "gpuvs.db")
    return tmp_path, golden.experiments(tmp_path / "gpuvs.db")["golden-compare-nlp"]


def one_line(r: subprocess.CompletedProcess, *words: str) -> str:
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("gpuvs: error: ") and all(w in line for w in words), line
    return line


def test_a_folder_is_refused_before_anything_is_written(store):
    folder, ident = store
    (folder / "out").mkdir()
    one_line(gpuvs("report", ident, "-o", "out", cwd=folder), "-o out: is a folder; name a file in it")
    one_line(gpuvs("results", "export", "-o", "out", cwd=folder), "-o out: is a folder")
    assert list((folder / "out").iterdir()) == []


@pytest.mark.parametrize("command", [["report", "{ident}", "--format", "html"], ["results", "export"]])
def test_a_full_device_and_a_file_nobody_may_write_are_one_line(store, command):
    folder, ident = store
    argv = [c.format(ident=ident) for c in command]
    one_line(gpuvs(*argv, "-o", "/dev/full", cwd=folder), "-o /dev/full: cannot write it (No space left on device)")
    before = Path("/proc/version").read_text()
    one_line(gpuvs(*argv, "-o", "/proc/version", cwd=folder), "-o /proc/version: cannot write it")
    assert Path("/proc/version").read_text() == before


@pytest.mark.parametrize("command", [["report", "{ident}", "--format", "html"], ["results", "export"]])
def test_a_write_that_fails_half_way_leaves_no_partial_file(store, command):
    folder, ident = store
    argv = [c.format(ident=ident) for c in command]
    one_line(gpuvs(*argv, "-o", "new.out", cwd=folder, file_limit=LIMIT), "-o new.out: cannot write it (File too "
             "large); no file was left there")
    assert not (folder / "new.out").exists()
    (folder / "old.out").write_text("the report of yesterday\n")
    one_line(gpuvs(*argv, "-o", "old.out", cwd=folder, file_limit=LIMIT), "the file as it was is kept")
    assert (folder / "old.out").read_text() == "the report of yesterday\n"
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith("gpuvs.db")) == ["old.out"]  # no temp


def test_a_report_written_whole_is_renamed_into_place_with_the_usual_mode(store):
    folder, ident = store
    r = gpuvs("report", ident, "--format", "html", "-o", "report.html", cwd=folder)
    assert r.returncode == 0, r.stderr
    page = (folder / "report.html").read_text()
    assert page.rstrip().endswith("</html>") and len(page) > LIMIT
    umask = os.umask(0)
    os.umask(umask)
    assert (folder / "report.html").stat().st_mode & 0o777 == 0o666 & ~umask  # as open() makes it, not mkstemp's
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith("gpuvs.db")) == ["report.html"]


def test_a_link_named_with_o_keeps_leading_to_the_report(store):
    folder, ident = store
    (folder / "real.md").write_text("old\n")
    (folder / "link.md").symlink_to("real.md")
    r = gpuvs("report", ident, "--format", "md", "-o", "link.md", cwd=folder)
    assert r.returncode == 0, r.stderr
    assert (folder / "link.md").is_symlink() and (folder / "real.md").read_text().startswith("## ")
