"""npz:PATH: the user's own arrays, loaded and checked."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest
import torch

from fedfactor.data import dataset_info, load_dataset, make_splits
from fedfactor.errors import UsageError

from .conftest import assert_one_line, expected_x


def test_npz_3d_and_4d_load(tmp_path):
    rng = np.random.default_rng(0)
    x3 = rng.integers(0, 255, size=(20, 6, 5)).astype(np.uint8)
    y = np.arange(20) % 4
    np.savez(tmp_path / "a.npz", x=x3, y=y)
    ds = load_dataset(f"npz:{tmp_path / 'a.npz'}")
    assert ds.x.shape == (20, 1, 6, 5) and ds.n_official_train == 20
    assert ds.info == dataset_info(f"npz:{tmp_path / 'a.npz'}")
    assert (ds.info.channels, ds.info.height, ds.info.width, ds.info.num_classes) == (1, 6, 5, 4)
    np.testing.assert_allclose(ds.x.numpy(), expected_x([x3[:, None]]), atol=1e-5)

    x4 = rng.normal(size=(10, 3, 4, 4)).astype(np.float64)
    np.savez_compressed(tmp_path / "b.npz", x=x4, y=(np.arange(10) % 7).astype(np.int32))
    ds = load_dataset(f"npz:{tmp_path / 'b.npz'}")
    assert ds.x.shape == (10, 3, 4, 4) and ds.info.num_classes == 7 and ds.info.augment == "none"
    np.testing.assert_allclose(ds.x.numpy(), expected_x([x4]), atol=1e-5)


def test_npz_test_part_is_appended_and_normalised_with_train_stats(tmp_path):
    rng = np.random.default_rng(1)
    x, x_test = rng.normal(3, 2, size=(12, 2, 3, 3)), rng.normal(-5, 1, size=(4, 2, 3, 3))
    y, y_test = np.arange(12) % 3, np.array([0, 1, 3, 4])  # classes 3 and 4 only in the test part
    path = tmp_path / "c.npz"
    np.savez(path, x=x, y=y, x_test=x_test, y_test=y_test)
    ds = load_dataset(f"npz:{path}")
    assert ds.n_official_train == 12 and len(ds.y) == 16
    assert ds.info.num_classes == 5  # max over train and test labels
    np.testing.assert_array_equal(ds.y.numpy(), np.concatenate([y, y_test]))
    np.testing.assert_allclose(ds.x.numpy(), expected_x([x, x_test]), atol=1e-5)
    # the test part keeps its offset: it is not re-centred
    assert ds.x[12:].mean().item() < -2
    splits = make_splits(len(ds.y), ds.n_official_train, mode="official")
    assert np.array_equal(splits["test"], np.arange(12, 16))


@pytest.mark.parametrize(
    "arrays, match",
    [
        ({"y": np.zeros(3, int)}, "no array 'x'"),
        ({"x": np.zeros((3, 4, 4))}, "no array 'y'"),
        ({"x": np.zeros((3, 4, 4)), "y": np.zeros(2, int)}, "3 samples but y has 2 labels"),
        ({"x": np.zeros((3, 4, 4)), "y": np.array([0, -1, 1])}, "negative label"),
        ({"x": np.zeros((3, 4)), "y": np.zeros(3, int)}, "N x H x W"),
        ({"x": np.zeros((3, 4, 4)), "y": np.zeros(3)}, "integer labels"),
        ({"x": np.zeros((3, 4, 4)), "y": np.zeros(3, int), "x_test": np.zeros((2, 4, 4))}, "x_test and y_test"),
        (
            {
                "x": np.zeros((3, 4, 4)),
                "y": np.zeros(3, int),
                "x_test": np.zeros((2, 5, 5)),
                "y_test": np.zeros(2, int),
            },
            "must match",
        ),
        ({"x": np.full((3, 4, 4), np.nan), "y": np.array([0, 1, 0])}, "NaN"),
        ({"x": np.zeros((3, 4, 4)), "y": np.array([0, 1, 200_000])}, "199998 of the 200001 classes"),
        ({"x": np.zeros((3, 4, 4)), "y": np.zeros(3, int)}, "every label is 0; .* at least two classes"),
        ({"x": np.zeros((3, 4, 4)), "y": np.full(3, 4, np.uint8)}, "4 of the 5 classes 0..4 have no"),
    ],
)
def test_bad_npz_files_are_usage_errors(tmp_path, arrays, match):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(UsageError, match=match) as err:
        load_dataset(f"npz:{path}")
    assert_one_line(err)


@pytest.mark.parametrize("key", ["x", "x_test"])
def test_npz_values_beyond_float32_are_refused_not_trained_on(tmp_path, key):
    # x1e300 is finite in float64, but not in the float32 the model computes in: it trained on all-zero inputs
    rng = np.random.default_rng(0)
    arrays = {"x": rng.uniform(0, 16, size=(6, 4, 4)), "y": np.arange(6) % 2,
              "x_test": rng.uniform(0, 16, size=(2, 4, 4)), "y_test": np.array([0, 1])}
    path = tmp_path / "scaled.npz"
    np.savez(path, **{**arrays, key: arrays[key] * 1e300})
    beyond = f"{key} holds values as large as .*e\\+301, beyond float32's 3.4e\\+38"
    with pytest.raises(UsageError, match=beyond) as err:
        load_dataset(f"npz:{path}")
    assert assert_one_line(err).startswith(f"{path}: ")
    np.savez(path, **{**arrays, key: arrays[key] * 1e37})  # large, but a float32 holds it
    x = load_dataset(f"npz:{path}").x
    assert torch.isfinite(x).all() and x.std() > 0.5


def test_npz_classes_count_labels_of_both_parts_and_refuse_gaps(tmp_path):
    x = np.zeros((4, 2, 2), np.float32)
    path = tmp_path / "gap.npz"
    # class 1 appears only in y_test and class 2 nowhere: dataset_info reads the labels only,
    # yet refuses the file just as load_dataset does
    np.savez(path, x=x, y=np.array([0, 0, 3, 3], np.uint16), x_test=x[:2], y_test=np.array([1, 1]))
    for read in (dataset_info, load_dataset):
        with pytest.raises(UsageError) as err:
            read(f"npz:{path}")
        text = assert_one_line(err)
        assert text.startswith(f"{path}: 1 of the 4 classes 0..3 have no sample")
        assert "the largest label is 3" in text
    np.savez(path, x=x, y=np.array([0, 0, 3, 3], np.uint16), x_test=x[:2], y_test=np.array([1, 2]))
    assert dataset_info(f"npz:{path}").num_classes == load_dataset(f"npz:{path}").info.num_classes == 4


def test_missing_or_unreadable_npz_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        dataset_info(f"npz:{tmp_path / 'nope.npz'}")
    with pytest.raises(UsageError, match="does not exist"):
        load_dataset(f"npz:{tmp_path / 'nope.npz'}")
    (tmp_path / "junk.npz").write_bytes(b"not a zip file at all")
    with pytest.raises(UsageError, match="cannot read"):
        load_dataset(f"npz:{tmp_path / 'junk.npz'}")
    with pytest.raises(UsageError, match="needs a file path"):
        load_dataset("npz:")


# ---------------------------------------------------------------------------------------------
# issue 39: an npz's declared sizes and memory checked from its headers before anything is loaded


def _npy_bytes(header: dict, payload: bytes) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, header)
    return out.getvalue() + payload


@pytest.mark.parametrize("key", ["x", "y", "x_test", "y_test"])
def test_npz_headers_declaring_more_than_the_file_holds_are_refused(tmp_path, key):
    arrays = {"x": np.zeros((4, 2, 2)), "y": np.arange(4) % 2, "x_test": np.zeros((2, 2, 2)), "y_test": np.arange(2)}
    path = tmp_path / "d.npz"
    with zipfile.ZipFile(path, "w") as zf:
        for k, a in arrays.items():
            if k == key:  # 10**13 entries declared on 8 bytes: a 73 TiB allocation if believed
                shape = (10**13, *a.shape[1:])
                zf.writestr(f"{k}.npy", _npy_bytes({"descr": "<i8", "fortran_order": False, "shape": shape}, b"\0" * 8))
            else:
                buf = io.BytesIO()
                np.save(buf, a)
                zf.writestr(f"{k}.npy", buf.getvalue())
    for read in (dataset_info, load_dataset):
        with pytest.raises(UsageError, match=f"the header of {key} declares shape .* but the file holds 8 bytes"):
            read(f"npz:{path}")


def test_an_npz_that_cannot_fit_in_memory_is_refused_before_loading(tmp_path, monkeypatch):
    from fedfactor.data import npz

    path = tmp_path / "d.npz"
    np.savez(path, x=np.zeros((100, 8, 8), np.uint8), y=np.arange(100) % 2)
    # 6,400 bytes of pixels and 800 of labels as stored, 25,600 more as float32
    monkeypatch.setattr(npz, "available_memory", lambda: 30_000)
    read = npz._read_npz

    def labels_only(path, keys):
        assert "x" not in keys, "the images were loaded before the memory check"
        return read(path, keys)

    monkeypatch.setattr(npz, "_read_npz", labels_only)
    with pytest.raises(UsageError, match=r"d.npz: its arrays take 0.00 GiB .* may take only 0.00 GiB more memory"):
        load_dataset(f"npz:{path}")


def test_an_npz_path_that_is_a_folder_is_named_a_folder(tmp_path):
    (tmp_path / "d.npz").mkdir()
    with pytest.raises(UsageError, match="is a folder, not a file"):
        dataset_info(f"npz:{tmp_path / 'd.npz'}")
