"""fedfactor: personalized federated learning with parameter factorization and decomposition."""

__version__ = "0.3.0"
