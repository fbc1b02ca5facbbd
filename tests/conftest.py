import pytest

# A tiny but real run: digits, 4 clients, 2 rounds, one epoch; seconds on a CPU.
TINY = [
    "data.name=digits", "model.name=cnn", "fl.clients=4", "fl.rounds=2", "fl.epochs=1",
    "fl.batch_size=32", "fl.lr=0.05", "fl.device=cpu", "tracking.enabled=false",
]


@pytest.fixture
def tiny():
    return list(TINY)
