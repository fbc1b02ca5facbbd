"""Run folders as a training job leaves them, for the diagnostics' tests: planted client weights and
FedFac's split history."""

import json

import numpy as np

LAYER, MODULE = 3, "body.7"


def planted(seed=0, K=6, d=12, fan_in=32, n_shared=6, noise=0.05):
    """K clients' weights of a layer of d units: the first n_shared are driven by 2 patterns common
    to every client (identical across clients but for small noise), the others are independent per
    client and per unit."""
    rng = np.random.default_rng(seed)
    patterns = rng.normal(size=(2, fan_in))
    w = np.empty((K, d, fan_in), np.float32)
    for j in range(n_shared):
        w[:, j] = rng.normal(size=2) @ patterns + noise * rng.normal(size=(K, fan_in))
    w[:, n_shared:] = rng.normal(size=(K, d - n_shared, fan_in))
    return w.reshape(K, d, 2, fan_in // 2)  # a conv-like K x d x ... shape: stacking must flatten it


def make_run(path, method="fedavg", seed=0, scenario="s", weights=None, layers=None, run_id=None, uri=None):
    """A finished run folder as a training job leaves it (the fields diagnose reads)."""
    path.mkdir(parents=True, exist_ok=True)
    layers = {str(LAYER): MODULE} if layers is None else layers
    summary = {"scenario": scenario, "method": method, "seed": seed, "accuracy": 0.5, "rounds": 4, "clients": 6,
               "analysed_layers": layers, "mlflow_run_id": run_id,
               "config": {"tracking": {"enabled": uri is not None, "uri": uri or "sqlite:///nowhere/mlflow.db"}}}
    (path / "summary.json").write_text(json.dumps(summary))
    if weights is not None:
        np.savez(path / "client_weights.npz", **{f"{MODULE}.weight": weights})
    return path


def write_history(path, states, index=LAYER):
    for r, s in enumerate(states, start=1):
        folder = path / "diagnostics" / f"fedfac.shared.{index}"
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / f"round_{r:04d}.npy", np.asarray(s, np.uint8))
        folder = path / "diagnostics" / f"fedfac.communality.{index}"
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / f"round_{r:04d}.npy", np.linspace(0, 1, len(s)))
