"""Fixtures of the chart tests: the pinned helm binary."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helm.chart import Helm, find_helm


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Helm]:
    yield Helm(find_helm(), tmp_path_factory.mktemp("helm-home"))
