"""The clients' data: the partition a config describes and each client's splits, as the simulator sets them up."""

import numpy as np
import pytest

from fedfactor.config import load_config
from fedfactor.errors import UsageError
from fedfactor.simulator import Simulator


def test_best_val_without_validation_data_is_refused(tiny):
    with pytest.raises(UsageError, match="val"):
        Simulator(load_config(None, tiny + ["data.split=[0.9, 0.0, 0.1]", "eval.report=best_val"]))


# -- natural clients (FEMNIST's writers, Shakespeare's roles) ---------------------------------------------------


@pytest.mark.parametrize("pool", ["client", "shared"])
def test_natural_clients_hold_their_writers_samples_cut_80_20(pool):
    cfg = load_config(None, ["data.name=synthetic:femnist", "partition.kind=natural", "fl.clients=6",
                             "data.split=[0.8, 0.0, 0.2]", "model.name=mlp", "fl.device=cpu",
                             f"eval.test_pool={pool}", "tracking.enabled=false"])
    sim = Simulator(cfg)
    from fedfactor.data import load_dataset

    owners = load_dataset("synthetic:femnist").owners
    writers = sim.partition.meta["natural_clients"]
    assert len(writers) == 6 == len(set(writers))
    for k, writer in enumerate(writers):
        train = sim.clients[k]["train"].idx.numpy()
        assert set(owners[train]) == {writer}
        own_test = sim.partition.clients[k]["test"]
        assert len(own_test) == max(1, round(0.2 * (owners == writer).sum())) and set(owners[own_test]) == {writer}
        test = sim.clients[k]["test"].idx.numpy()
        # the shared pool: every chosen writer's test samples, no one else's
        assert np.array_equal(test, own_test if pool == "client" else sim.partition.pools["test"])
    assert set(owners[sim.partition.pools["test"]]) == set(writers)


def test_build_partition_passes_owners_only_to_the_natural_kind():
    from fedfactor.data import load_dataset
    from fedfactor.clients import build_partition

    ds = load_dataset("synthetic:femnist")
    y = ds.y.numpy()
    cfg = load_config(None, ["data.name=synthetic:femnist", "fl.clients=5"])
    assert build_partition(cfg, y, ds.n_official_train, 62, ds.owners) == build_partition(cfg, y,
                                                                                           ds.n_official_train, 62)
    natural = load_config(None, ["data.name=synthetic:femnist", "fl.clients=5", "partition.kind=natural"])
    with pytest.raises(UsageError, match="needs data whose samples come from natural clients"):
        build_partition(natural, y, ds.n_official_train, 62)
