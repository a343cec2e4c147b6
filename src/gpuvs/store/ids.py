"""The one maker of the ids the store and the agent key things by: an experiment's, an agent run's.
An id sorts by when it was made: the second, then a random tail."""

from __future__ import annotations

import time
import uuid


def new_id(tail: str = "", *, chars: int = 6, utc: bool = False) -> str:
    """YYYYMMDD-HHMMSS- (local time, or UTC) and `chars` random hex digits, or `tail` where the caller shares one
    (validate's pods carry it in their names)."""
    stamp = time.strftime("%Y%m%d-%H%M%S-", time.gmtime() if utc else time.localtime())
    return stamp + (tail or uuid.uuid4().hex[:chars])
