"""Writing the tuning report: an atomic write that keeps the previous page whole on failure, the
link to the best config only where it lies beside the page, and the record left unmodified."""

from __future__ import annotations

import copy

import pytest
from tunereportkit import keep_current, realistic

import perfscope.atomic
from perfscope.reports import render_tuning, write_tuning


def test_write_tuning_writes_atomically(tmp_path, monkeypatch):
    path = tmp_path / "out" / "report.html"
    assert write_tuning(realistic(), path) == path
    assert path.read_text(encoding="utf-8") == render_tuning(realistic())
    assert sorted(p.name for p in path.parent.iterdir()) == ["report.html"]  # no temporary file left

    # a failure at the rename keeps the previous page whole and leaves no temporary file behind
    def broken_replace(src, dst):
        raise OSError("disk full")

    before = path.read_bytes()
    monkeypatch.setattr(perfscope.atomic.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_tuning(keep_current(), path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["report.html"]


def test_best_config_link(tmp_path):
    r = realistic()
    r["best_config"] = "tuned.yaml"  # perfscope tune --out tuned.yaml
    html = write_tuning(r, tmp_path / "report.html").read_text()
    assert 'href="tuned.yaml"' in html and 'href="best.yaml"' not in html
    r["best_config"] = "/elsewhere/tuned.yaml"  # outside the output folder: named, not linked
    html = render_tuning(r)
    assert 'href="/elsewhere' not in html and "/elsewhere/tuned.yaml" in html


def test_record_is_not_modified():
    r = realistic()
    before = copy.deepcopy(r)
    render_tuning(r)
    assert r == before
