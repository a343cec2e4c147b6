"""The statistics: per-trial summaries, the family of verdicts, the sequential plan, one experiment's comparison
and time-share verdicts. Reads typed records; never runs anything."""
