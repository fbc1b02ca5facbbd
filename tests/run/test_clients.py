"""The clients' data: the partition a config describes and each client's splits, as the simulator sets them up."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fedfactor.config import load_config
from fedfactor.errors import UsageError
from fedfactor.run.simulator import Simulator


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
    from fedfactor.run.clients import build_partition

    ds = load_dataset("synthetic:femnist")
    y = ds.y.numpy()
    cfg = load_config(None, ["data.name=synthetic:femnist", "fl.clients=5"])
    assert build_partition(cfg, y, ds.n_official_train, 62, ds.owners) == build_partition(cfg, y,
                                                                                           ds.n_official_train, 62)
    natural = load_config(None, ["data.name=synthetic:femnist", "fl.clients=5", "partition.kind=natural"])
    with pytest.raises(UsageError, match="needs data whose samples come from natural clients"):
        build_partition(natural, y, ds.n_official_train, 62)


# -- one cut of the data for a study, whatever the run seed ------------------------------------------------------

# Every partition kind, split mode and test pool a study may combine, with held-out new clients:
# (the run config's sets, whether the data have an official test part, whether they have natural owners)
CUTS = [
    (["partition.kind=iid"], False, False),
    (["partition.kind=dirichlet", "partition.alpha=0.3", "eval.test_pool=shared"], False, False),
    (["partition.kind=dirichlet", "partition.alpha=0.5", "partition.permute_labels=true"], True, False),
    (["partition.kind=shards", "partition.classes_per_client=2", "eval.new_clients=0.25"], False, False),
    (["partition.kind=class_groups", "partition.groups=[[0, 1], [2, 3, 4]]", "partition.clients_per_group=4",
      "eval.test_pool=shared"], True, False),
    (["partition.kind=dirichlet_fixed", "partition.alpha=0.1", "partition.samples_per_client.train=20",
      "partition.samples_per_client.val=4", "partition.samples_per_client.test=6"], False, False),
    (["partition.kind=dirichlet_fixed", "partition.overlap=false", "partition.samples_per_client.train=8",
      "partition.samples_per_client.val=2", "partition.samples_per_client.test=3", "eval.new_clients=0.25",
      "eval.test_pool=shared"], True, False),
    (["partition.kind=natural", "eval.new_clients=0.25"], False, True),
    (["partition.kind=natural", "eval.test_pool=shared"], False, True),
]


def _scored(cfg, y, n_official, owners, splits):
    """The sample indices a run with config `cfg` uses as each of `splits`, over every client (those
    held out as new clients too), as the simulator gives them under the run's test pool."""
    from fedfactor.run.clients import build_partition, client_split, held_out_clients

    part = build_partition(cfg, y, n_official, int(y.max()) + 1, owners)
    assert set(held_out_clients(cfg.fl.clients, cfg.eval.new_clients, cfg.seed)) <= set(range(cfg.fl.clients))
    shared = cfg.eval.test_pool == "shared"
    return np.concatenate([client_split(part, y, k, s, shared, torch.device("cpu")).idx.numpy()
                           for k in range(cfg.fl.clients) for s in splits])


def _cut_name(sets, official, natural):
    return "-".join([s.split("=")[1] for s in sets if s.startswith("partition.kind")] +
                    [s.replace("eval.", "") for s in sets if s.startswith("eval.")] + (["official"] if official else []))


@pytest.mark.parametrize("sets, official, natural", CUTS, ids=[_cut_name(*c) for c in CUTS])
# no shrinking: a leak shows in the first example it fails on, and shrinking one took minutes
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(data=st.data())
def test_no_sample_a_final_run_scores_is_in_any_tuning_runs_train_or_validation_data(sets, official, natural, data):
    # the labels, the owners and every seed drawn; data.seed shared by the tuning and the final runs
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="data"))
    n = 600
    y = np.concatenate([np.arange(5), rng.integers(0, 5, n - 5)])
    owners = np.concatenate([np.arange(12), rng.integers(0, 12, n - 12)]) if natural else None
    n_official = 480 if official else n
    data_seed = data.draw(st.integers(0, 2**32 - 1), label="data.seed")
    tuning_seed = data.draw(st.integers(0, 2**32 - 1), label="tuning seed")
    final_seeds = data.draw(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=3, unique=True), label="seeds")
    base = ["fl.clients=8", f"data.seed={data_seed}", "data.split=[0.7, 0.15, 0.15]",
            f"data.split_mode={'official' if official else 'pooled'}", *sets]
    tuned_on = _scored(load_config(None, [*base, f"seed={tuning_seed}"]), y, n_official, owners,
                       ("train", "val", "own_val"))
    for seed in final_seeds:
        scored = _scored(load_config(None, [*base, f"seed={seed}"]), y, n_official, owners, ("test",))
        assert len(scored) and not np.intersect1d(tuned_on, scored).size, f"final seed {seed}"


def test_a_partition_cut_with_another_data_seed_is_refused(tmp_path):
    from fedfactor.run.clients import build_partition, read_partition

    y = np.repeat(np.arange(4), 50)
    cfg = load_config(None, ["fl.clients=4", "data.seed=3", f"partition.file={tmp_path / 'p.json'}"])
    build_partition(cfg, y, len(y), 4).save(tmp_path / "p.json", y)
    assert read_partition(cfg.partition.file, 4, 3).meta["data_seed"] == 3
    with pytest.raises(UsageError, match=r"was cut with data.seed=3, but the run has data.seed=4"):
        read_partition(cfg.partition.file, 4, 4)
    with pytest.raises(UsageError, match=r"has 4 clients but fl.clients is 5"):
        read_partition(cfg.partition.file, 5, 3)
