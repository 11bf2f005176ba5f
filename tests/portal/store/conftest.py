from __future__ import annotations

from collections.abc import Iterator

import pytest

from portal.store.records import ChangeSet
from portal.store.writer import Store
from tests.portal.store.builders import tenant


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    """A migrated, empty store on the parametrized database."""
    with Store.open(db_url) as s:
        yield s


@pytest.fixture
def acme(store: Store) -> Store:
    """The store with one tenant, ``acme``."""
    store.commit(ChangeSet(tenants=[tenant("acme")]))
    return store
