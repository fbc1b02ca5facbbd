"""Reliability probes: throw bad input and load at the real commands, count how each ends (README, "Reliability")."""
