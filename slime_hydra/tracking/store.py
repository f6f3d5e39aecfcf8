"""Opening an MLflow store so that runs started together cannot break it, and a store that is broken is named.

MLflow creates (or upgrades) a sqlite store's schema when a client first opens it, with no lock: runs started
together in a fresh directory race on it, fail with alembic errors, and leave the store with a half-made
migration (an `_alembic_tmp_<table>` copy) that fails every later run. Here a sqlite store is opened under an
exclusive lock on `<db>.lock` beside it, so its schema is created or upgraded once while the others wait; a
half-made migration is repaired first (SQLite batch migrations copy a table into `_alembic_tmp_<table>`, drop the
original, then rename the copy: with the original still there, the copy is dropped; without it, the copy is
complete and is renamed back), and MLflow then upgrades from the revision the store records. A store that still does
not open is a StoreError naming it and the commands that repair it. Other stores (a tracking server) are the
server's to keep. Imports mlflow only when called (the sweep callback imports this floor for every run).
"""

from __future__ import annotations

import contextlib
import fcntl
import sqlite3
from pathlib import Path
from typing import Any, Iterator, Optional
from urllib.parse import urlsplit

from slime_hydra.errors import RunError

SQLITE = "sqlite:///"
TMP_PREFIX = "_alembic_tmp_"


class StoreError(RunError):
    """The tracking store could not be opened or written: the message names it and the fix."""


def sqlite_path(uri: str) -> Optional[Path]:
    """The database file of a `sqlite:///` URI (None for another store or an in-memory one)."""
    if not uri.startswith(SQLITE):
        return None
    path = uri[len(SQLITE):].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


@contextlib.contextmanager
def store_lock(db: Path) -> Iterator[None]:
    """An exclusive flock on `<db>.lock`, held while the schema is made (every process of this package takes it)."""
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def repair_half_made_migration(db: Path) -> list[str]:
    """Undoes what a migration interrupted between its steps left behind (module docstring); what it did, one line each."""
    if not db.is_file():
        return []
    done = []
    with contextlib.closing(sqlite3.connect(db, timeout=60)) as con:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for tmp in sorted(t for t in tables if t.startswith(TMP_PREFIX)):
            table = tmp[len(TMP_PREFIX):]
            if table in tables:
                con.execute(f'DROP TABLE "{tmp}"')
                done.append(f"dropped {tmp}, an unfinished copy of {table}")
            else:
                con.execute(f'ALTER TABLE "{tmp}" RENAME TO "{table}"')
                done.append(f"renamed {tmp} back to {table}, which the interrupted migration had dropped")
        con.commit()
    return done


def shown(uri: str) -> str:
    """The URI as a message may show it: without user:password@."""
    parts = urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri
    return parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")).geturl()


def repair_hint(uri: str, db: Path) -> str:
    return (f"back it up (cp {db} {db}.bak), then run `mlflow db upgrade {uri}`; if that fails too, the schema is "
            f"inconsistent: move {db} aside (its runs stay readable with `mlflow ui --backend-store-uri {uri}` on the "
            "copy) and start again with a fresh store, or run with logger.tracker=none")


def open_client(uri: str) -> Any:
    """An `MlflowClient` on `uri` whose store is ready: a sqlite store's schema made once under the lock, a half-made
    migration repaired; StoreError naming the store and the fix when it does not open."""
    import logging

    from mlflow.tracking import MlflowClient

    db = sqlite_path(uri)
    try:
        if db is None:
            client = MlflowClient(tracking_uri=uri)
            client.search_experiments(max_results=1)  # reachable, and answering as a store
            return client
        with store_lock(db):
            for line in repair_half_made_migration(db):
                logging.getLogger(__name__).warning("MLflow store %s: %s", db, line)
            client = MlflowClient(tracking_uri=uri)
            client.search_experiments(max_results=1)  # creates or upgrades the schema, under the lock
            return client
    except StoreError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure to open the store is reported with its fix
        what = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
        fix = repair_hint(uri, db) if db is not None else ("check that the server is up and reachable from here, or "
                                                           "run with logger.tracker=none")
        raise StoreError(f"logger.tracking_uri={shown(uri)}: the MLflow store could not be opened ({what}); {fix}") from None
