"""Every command that renders stored results gives, on tests/data/golden/golden.db, exactly the output it gave.

The store and outputs came from real tiny CPU runs (tests/data/make_golden.py), of every kind gpuvs stores.
What would differ between machines is fixed, not masked (tests/golden.py says why); every byte is compared."""

from __future__ import annotations

import difflib
import json
import sqlite3
import subprocess
import sys

import golden

from conftest import SRC, gpuvs_env

KINDS = {"run", "compare", "fleet", "share", "advise-mps", "share-matrix", "validate"}


def test_the_golden_store_holds_every_kind_of_experiment():
    db = sqlite3.connect(f"file:{golden.STORE}?mode=ro", uri=True)
    kinds = {k for k, in db.execute("SELECT kind FROM experiments")}
    statuses = {s for s, in db.execute("SELECT status FROM trials")}
    retried = db.execute("SELECT COUNT(*) FROM trials WHERE attempt > 0").fetchone()[0]
    db.close()
    assert kinds >= KINDS and statuses == {"ok", "failed", "interrupted"} and retried >= 1


def test_every_stored_result_renders_as_it_did(tmp_path):
    out = tmp_path / "outputs"
    r = subprocess.run([sys.executable, str(golden.HERE / "golden.py"), "render", str(golden.STORE), str(out)],
                       capture_output=True, text=True, timeout=600, env=gpuvs_env(PYTHONPATH=str(SRC)))
    assert r.returncode == 0, r.stderr[-3000:]
    want = sorted(p.name for p in golden.OUTPUTS.iterdir())
    got = sorted(p.name for p in out.iterdir())
    assert got == want
    assert len(want) > 100  # every experiment in every format, not an empty folder
    differ = []
    for name in want:
        old, new = (golden.OUTPUTS / name).read_bytes(), (out / name).read_bytes()
        if old != new:
            diff = difflib.unified_diff(old.decode().splitlines(), new.decode().splitlines(), f"golden/{name}",
                                        f"now/{name}", lineterm="", n=1)
            differ.append("\n".join(list(diff)[:40]))
    assert not differ, f"{len(differ)} of {len(want)} outputs changed:\n\n" + "\n\n".join(differ[:6])


def test_the_json_outputs_are_json():
    """The golden files themselves are what the formats promise (a truncated or empty one would compare equal
    to itself forever)."""
    for path in golden.OUTPUTS.glob("*.report.json"):
        text = path.read_text()
        body = text.split("[stdout]\n", 1)[1].rsplit("\n[stderr]\n", 1)[0]
        assert "[exit status 0]" in text and isinstance(json.loads(body), dict), path.name
