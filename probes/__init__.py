"""Reliability probes: throw bad input and load at the real commands, count how each ends (docs/reliability.md)."""
