"""Analyses of client weights: similarity matrices (and, later, factor analysis)."""
