"""The one walker over task arguments: every GPU result found and replaced by one rule."""

from __future__ import annotations

import dataclasses
from collections import namedtuple

import polars as pl
from pydantic import BaseModel, ConfigDict

from prefect_cudf_polars.blocks.arguments import replace_results, results_in

Pair = namedtuple("Pair", "left right")


@dataclasses.dataclass
class Inputs:
    main: object
    extra: object = None


class Config(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    result: object
    limit: int = 3


def test_containers_without_results_come_back_as_the_same_objects(cpu_block, orders):
    plain = (1, [2, {"k": 3}], Pair(1, 2))
    assert replace_results(plain, lambda r: "fresh") is plain
    assert results_in(plain) == []


def test_results_are_found_and_replaced_in_every_container_prefect_walks(cpu_block, orders):
    with cpu_block.session() as session:
        r = session.execute(pl.scan_parquet(orders), name="r")
        s = session.execute(pl.scan_parquet(orders), name="s")
        args = (r, [r], {"x": Pair(r, 1)}, {s: "as a dict key"}, Inputs(r, {s}), Config(result=r))
        assert [x.name for x in results_in(args)] == ["r", "s"]

        calls = []

        def fresh(result):
            calls.append(result.name)
            return f"fresh-{result.name}"

        swapped = replace_results(args, fresh)
        assert calls == ["r", "s"]  # each distinct result replaced once
        assert swapped[:4] == (
            "fresh-r",
            ["fresh-r"],
            {"x": Pair("fresh-r", 1)},
            {"fresh-s": "as a dict key"},
        )
        assert isinstance(swapped[2]["x"], Pair)
        assert swapped[4] == Inputs("fresh-r", {"fresh-s"})
        assert swapped[5].result == "fresh-r" and swapped[5].limit == 3
        assert args[0] is r  # the original arguments are left as they were


def test_lazy_frames_are_leaves(cpu_block, orders):
    lf = pl.scan_parquet(orders)
    args = {"q": [lf, lf]}
    assert results_in(args) == [] and replace_results(args, lambda r: "fresh") is args
