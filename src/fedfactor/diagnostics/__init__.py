"""Diagnostics of finished runs: the factor analysis of their clients' weights (`fedfactor diagnose`).

A run keeps its clients' final weights of the analysed layers (weights.py); `fedfactor diagnose` reads
them back (runs.py), analyses each layer (layer_analysis.py) and writes its tables (tables.py),
figures (figures.py) and MLflow metrics (diagnose.py).
"""
