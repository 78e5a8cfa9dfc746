"""Shared fixtures: a PostgreSQL server for the tests marked ``postgres``.

``.ci/run`` starts a throwaway server on 127.0.0.1 and exports
``AUTOREMAT_TEST_POSTGRES_URL``; locally, point it at any server you may
create databases on. Without it (or when the server does not answer) those
tests are skipped with the reason, never passed.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

POSTGRES_ENV = "AUTOREMAT_TEST_POSTGRES_URL"
NO_POSTGRES = f"no PostgreSQL server: set {POSTGRES_ENV} (.ci/run starts one)"


@pytest.fixture(scope="session")
def postgres_server() -> str:
    """The server URL from ``AUTOREMAT_TEST_POSTGRES_URL``, checked to answer."""
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(NO_POSTGRES)
    try:
        import sqlalchemy

        engine = sqlalchemy.create_engine(url)
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT 1"))
        engine.dispose()
    except Exception as e:
        from autoremat._storage import redact

        pytest.skip(f"no PostgreSQL server at {redact(url)} ({type(e).__name__}: "
                    f"{' '.join(str(e).split())[:200]}); {NO_POSTGRES}")
    return url


@pytest.fixture()
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A fresh, empty database on that server for one test (dropped afterwards)."""
    import sqlalchemy

    name = f"autoremat_t_{uuid.uuid4().hex[:12]}"
    admin = sqlalchemy.create_engine(postgres_server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
    url = sqlalchemy.make_url(postgres_server).set(database=name)
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(sqlalchemy.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
