import json
import sqlite3

import pytest

from gpuvs.errors import UsageError
from gpuvs.spec import RunSpec
from gpuvs.store import Store
from gpuvs import events


def _spec(**kw):
    return RunSpec(workload="selftest", device="cpu", experiment_id="e1", **kw)


def test_trial_is_committed_with_its_events_and_exports(store_path):
    with Store(store_path) as st:
        st.create_experiment("e1", "demo", "run", {"k": 1})
        tid = st.begin_trial(_spec(trial=0))
        for i in range(3):
            st.add_event(tid, events.sample(i + 1, 10.0 + i, "steps/sec", seconds=0.1, items=1))
        st.add_event(tid, {"type": "telemetry", "t": 0.5, "gpu": 0, "power_w": 100.0})
        st.finish_trial(tid, "ok", summary={"main": {"value": 11.0, "unit": "steps/sec"}})
    with Store(store_path) as st:
        t = st.trial(tid)
        assert t["status"] == "ok" and t["summary"]["main"]["value"] == 11.0
        assert [s["value"] for s in st.samples(tid)] == [10.0, 11.0, 12.0]
        assert st.telemetry(tid) == [{"t": 0.5, "gpu": 0, "power_w": 100.0}]
        data = json.loads(st.export("json"))
        assert data["trials"][0]["samples"][2]["step"] == 3
        csv_text = st.export("csv")
        assert "11.0" in csv_text.splitlines()[1] and csv_text.startswith("trial_id,")
        with pytest.raises(UsageError, match="json or csv"):
            st.export("xml")


def test_a_crash_loses_only_the_trial_in_flight(store_path):
    st = Store(store_path)
    st.create_experiment("e1", "demo", "run", {})
    done = st.begin_trial(_spec(trial=0))
    st.add_event(done, events.sample(1, 1.0, "x/sec"))
    st.finish_trial(done, "ok")
    inflight = st.begin_trial(_spec(trial=1))
    st.add_event(inflight, events.sample(1, 2.0, "x/sec"))
    # the process dies here: no finish_trial; simulate a dead owner
    import socket
    st.db.execute("UPDATE trials SET owner=? WHERE id=?", (f"{socket.gethostname()}:999999999", inflight))
    del st
    with Store(store_path) as st2:
        assert st2.trial(done)["status"] == "ok" and len(st2.samples(done)) == 1
        assert st2.trial(inflight)["status"] == "interrupted"
        assert st2.samples(inflight) == []


def test_bad_store_paths_are_one_line_errors(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        Store(tmp_path / "no" / "such" / "x.db")
    bad = tmp_path / "not.db"
    bad.write_text("this is not sqlite" * 100)
    with pytest.raises(UsageError, match="cannot open store"):
        Store(bad)


def test_schema_is_plain_sqlite(store_path):
    Store(store_path).close()
    names = {r[0] for r in sqlite3.connect(store_path).execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"experiments", "trials", "samples", "telemetry"} <= names
