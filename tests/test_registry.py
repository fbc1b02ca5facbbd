"""The name -> object registries: lookups name every choice, and a scope takes back what it added."""

import pytest

from fedfactor.errors import UsageError
from fedfactor.registry import Registry


def test_unknown_names_list_every_choice_and_a_name_registers_once():
    colours = Registry("colour")
    colours.register("red", "warm")(1)
    colours.register("blue", "cold")(2)
    assert colours.get("red") == 1 and colours.describe() == [("blue", "cold"), ("red", "warm")]
    with pytest.raises(UsageError, match="unknown colour 'green'; choose one of: blue, red"):
        colours.get("green")
    with pytest.raises(ValueError, match="colour 'red' is registered twice"):
        colours.register("red", "again")(3)


def test_a_scope_removes_what_it_registered_and_keeps_the_rest():
    colours = Registry("colour")
    colours.register("red", "warm")(1)
    with colours.scope() as scoped:
        scoped.register("green", "test only")(2)
        assert colours.names() == ["green", "red"]
    assert colours.names() == ["red"] and "green" not in colours
    # an error inside the block takes the entries back too
    with pytest.raises(RuntimeError), colours.scope():
        colours.register("blue", "test only")(3)
        raise RuntimeError
    assert colours.names() == ["red"]
