"""
Prefect's standard checks for integration blocks (``BlockStandardTestSuite``), over
every block this package registers (``CudfPolarsEngine``).

The suite's image check downloads the block's ``_logo_url``; CI has no network, so
that one check is skipped here and every other check runs.
"""

from __future__ import annotations

import pytest
from prefect.blocks.core import Block
from prefect.testing.standard_test_suites import BlockStandardTestSuite
from prefect.utilities.dispatch import get_registry_for_type
from prefect.utilities.importtools import to_qualified_name

from prefect_cudf_polars.blocks import CudfPolarsEngine


def package_blocks() -> list[type[Block]]:
    """The block classes defined in ``prefect_cudf_polars``, as Prefect's registry holds them."""
    return [
        cls
        for cls in get_registry_for_type(Block).values()
        if to_qualified_name(cls).startswith("prefect_cudf_polars.")
    ]


def test_the_engine_block_is_registered():
    assert CudfPolarsEngine in package_blocks()


@pytest.mark.parametrize("block", package_blocks(), ids=lambda cls: cls.__name__)
class TestBlockStandards(BlockStandardTestSuite):
    @pytest.fixture
    def block(self, block: type[Block]) -> type[Block]:
        return block

    @pytest.mark.skip(reason="downloads the block's _logo_url; CI has no network")
    def test_has_a_valid_image(self, block: type[Block]) -> None:
        """Not run (see the reason); ``test_logo_url_is_an_https_url`` checks the URL offline."""

    def test_logo_url_is_an_https_url(self, block: type[Block]) -> None:
        assert str(block._logo_url).startswith("https://")
