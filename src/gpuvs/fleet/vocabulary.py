"""The one set of words a node's verdict is said in, everywhere: labels, metrics, reports, conditions.

The words are analysis.stats.settled_verdict's, and reference (docs/vocabulary.md holds the table).
Labels written before this vocabulary are read as the words they meant (word())."""

from __future__ import annotations

WORDS = ("slower", "slower-within-margin", "equivalent", "faster-within-margin", "faster", "inconclusive",
         "reference")
OLD = {"ok": "equivalent", "slow": "slower", "slow-within-margin": "slower-within-margin",
       "fast-within-margin": "faster-within-margin"}  # gpuvs.io/perf and gpuvs.io/drift as written before


def word(value: str | None) -> str:
    """A verdict or a label's value, old or new, as one of WORDS (anything else: inconclusive)."""
    v = OLD.get(value or "", value or "")
    return v if v in WORDS else "inconclusive"


# the NodeCondition GpuvsPerformance: (status, reason) for each word; True when the problem is present
_REASONS = {"slower": ("True", None), "slower-within-margin": ("False", "SlowerWithinMargin"),
            "equivalent": ("False", "Ok"), "faster-within-margin": ("False", "Ok"), "faster": ("False", "Ok"),
            "reference": ("False", "Ok"), "inconclusive": ("Unknown", "Inconclusive")}


def condition(verdict: str, against: str = "peers") -> tuple[str, str]:
    """(status, reason) of gpuvs's NodeCondition for a verdict against peers (SlowerThanPeers) or the node's own
    past (DriftingSlower)."""
    status, reason = _REASONS[word(verdict)]
    return status, reason or ("SlowerThanPeers" if against == "peers" else "DriftingSlower")
