"""Mathematics on client weights: similarity matrices and mixing weights, factor analysis (factor.py)."""
