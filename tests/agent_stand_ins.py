"""Stand-ins for the library calls the agent makes in its child process (tests/agent/test_agent.py).

They are module-level, so that the spawned child imports them by name.
Each stores a real validate experiment, and writes to stderr a line like `gpuvs validate`'s naming another one.
The agent must take the id from what the call returns or emits, never from text."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from gpuvs.store.db import Store
from gpuvs.store.ids import new_id
from gpuvs.store.records import ExperimentMeta
from gpuvs.validate.validate_run import KIND, ValidateResult
from gpuvs.validate.suite import FAIL, PASS, Row

DECOY = "19990101-000000-decoy0"
ROWS = [Row("functional", "GPU nodes", PASS, "2 nodes"), Row("functional", "CPU pod", FAIL, "no")]


def _stored(store: str, name: str) -> str:
    exp_id = new_id("stand1")
    with Store(store) as st:
        st.create_experiment(exp_id, name, KIND, ExperimentMeta(checks=[r.to_dict() for r in ROWS]))
    print(f"gpuvs validate: h (x), namespace default, experiment {DECOY}", file=sys.stderr, flush=True)
    return exp_id


def validate_returns(emit, settings, store, **kw):
    """A validate run that ends: its result returned, nothing emitted."""
    return ValidateResult(_stored(store, kw["name"]), "h", "x", kw["namespace"], list(ROWS))


def validate_hangs(emit, settings, store, **kw):
    """A validate run that hangs after its experiment exists: emitted at once; on SIGTERM (the agent's
    --run-timeout) it cleans up, leaving a mark next to the store, and goes."""
    emit(_stored(store, kw["name"]))
    try:
        time.sleep(600)
    finally:
        Path(store).with_suffix(".cleaned").write_text("yes")


def fleet_all_failed(emit, base, store, options, choice=None):
    """A fleet whose every trial failed on every node (the GPU check where no GPU is visible): a result, stored,
    that judges no node."""
    from gpuvs.fleet.execute.adaptive import AdaptiveTrials
    from gpuvs.fleet.result import FleetResult, NodeRow
    from gpuvs.fleet.assess.node_verdicts import ErrorControl

    exp_id = new_id("allbad")
    rows = [NodeRow(n, "failed", "every trial failed: GPU not visible", n_ok=0, n_trials=4) for n in options.nodes]
    result = FleetResult(exp_id, base.workload, "ops/s", True, 0.05, 0.95, AdaptiveTrials(4, 12, 4),
                         ErrorControl(0.95, 3, len(rows)), 1, rows)
    with Store(store) as st:
        st.create_experiment(exp_id, options.name, "fleet", ExperimentMeta(fleet=result.to_dict()))
    print("gpuvs fleet: GPU not visible", file=sys.stderr, flush=True)
    return result
