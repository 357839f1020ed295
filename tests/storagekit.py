"""Helpers of the study-storage tests (``test_tune_storage_*.py``): a fresh study name, and the
URL of each storage form (SQLite, journal file, PostgreSQL in its three spellings)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest


def study_name() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


def storage_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str | None:
    """The URL of each form for the storage of ``kind`` (None: the default in ``tmp_path/out``)."""
    if kind == "default":
        return None
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'sub' / 'study.db'}"
    if kind == "journal":
        return f"journal:{tmp_path / 'new-folder' / 'study'}"
    if kind == "journal-suffix":
        return str(tmp_path / "study.journal")
    url = request.getfixturevalue("postgres_url")
    if kind == "postgresql+psycopg2":
        return url.replace("postgresql://", "postgresql+psycopg2://", 1)
    if kind == "postgres":  # the libpq / Heroku spelling
        return url.replace("postgresql://", "postgres://", 1)
    assert kind == "postgresql"
    return url
