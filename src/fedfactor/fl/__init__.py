"""The federated primitives: state helpers, communication meter, local training (the round loop: simulator.py)."""
