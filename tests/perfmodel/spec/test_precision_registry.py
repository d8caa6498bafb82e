"""One precision registry: the names a framework or launch config takes, the ``--precision``
names and the low-precision recipes the compute model prices all agree."""

from __future__ import annotations

import typing

from perfmodel.compute.layer import LOW_PRECISION_RECIPES
from perfmodel.spec.frameworks import FrameworkSpec, PrecisionRecipe
from perfmodel.spec.specs import PRECISION_RECIPES, PRECISIONS, RECIPE_PRECISIONS

DTYPES = ("fp32", "bf16", "fp16")


def test_recipe_precisions_are_the_dtypes_and_each_recipe_once():
    recipes = {recipe for _, recipe in PRECISION_RECIPES.values()}
    assert RECIPE_PRECISIONS[:3] == DTYPES
    assert sorted(RECIPE_PRECISIONS[3:]) == sorted(recipes)
    assert set(LOW_PRECISION_RECIPES) == recipes


def test_every_recipe_name_is_a_precision_name():
    assert set(RECIPE_PRECISIONS) <= set(PRECISIONS)


def test_frameworks_take_the_registry():
    assert typing.get_args(PrecisionRecipe) == RECIPE_PRECISIONS
    assert FrameworkSpec.model_fields["precisions"].default == RECIPE_PRECISIONS
