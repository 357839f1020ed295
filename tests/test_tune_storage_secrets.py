"""A study URL's password never leaves perfscope, however it is spelled: a real PostgreSQL login
whose password holds a space and an ``@`` (written ``%40``, as perfscope's own message asks), and
one whose user name is URL-encoded, tuned end to end; the password is in none of stdout, stderr,
``tune.json``, ``report.html`` or the study's user attributes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import optuna
import pytest

import pg
from perfscope.redact import redact, url_secrets
from perfscope.tuner.storage import open_storage

ROOT = Path(__file__).resolve().parents[1]
SIMULATED_TUNE = ROOT / "tests" / "scripts" / "simulated_tune.py"


# Each piece of each password is distinctive: none of them may appear anywhere.
# (role, its password, the user as spelled in the URL, the password as spelled in the URL)
LOGINS = [
    ("{u}", "myqz p@ssqz", "{u}", "myqz p%40ssqz"),
    ("{u}e", "Secqz retqz", "{u}%65", "Secqz retqz"),
    ("{u}", "aqz:bqz/cqz?dqz", "{u}", "aqz%3Abqz%2Fcqz%3Fdqz"),
]


@pytest.mark.parametrize("role, password, user, spelled", LOGINS)
def test_a_real_login_password_is_in_no_output(postgres_url, tmp_path, role, password, user, spelled):
    name = f"pwtest_{uuid.uuid4().hex[:8]}"
    role, user = role.format(u=name), user.format(u=name)
    where = pg.create_login(postgres_url, role, password)
    url = f"postgresql://{user}:{spelled}@{where}/{role}"
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(SIMULATED_TUNE), str(out), "--trials", "2", "--storage", url],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((out / "tune.json").read_text())
    assert record["study"]["storage"] == f"postgresql://***@{where}/{role}"
    study = optuna.load_study(study_name="tune-train", storage=open_storage(url, tmp_path))
    attrs = json.dumps([study.user_attrs, [t.user_attrs for t in study.trials]])
    texts = {"stdout": done.stdout, "stderr": done.stderr, "tune.json": (out / "tune.json").read_text(),
             "report.html": (out / "report.html").read_text(), "user attributes": attrs}
    for spelling in {password, spelled, *password.split(), *spelled.split()} - {""}:
        for where_, text in texts.items():
            assert spelling not in text, f"{spelling!r} in {where_}"


@pytest.mark.parametrize("text, secret", [
    ("cannot open study storage postgresql://perfscope:my p%40ss@127.0.0.1:5432/optuna: refused", "p%40ss"),
    ("postgresql://perfscop%65:Sec ret@127.0.0.1:5432/optuna", "ret"),
    ('FATAL: could not connect to "postgresql://u:pa ss@w@h/db" (timeout)', "ss@w"),
    ("two: postgresql://a:x y@h1/db and mysql://b:z w@h2/db", "y@"),
])
def test_a_url_in_free_text_is_masked_up_to_its_last_at(text, secret):
    masked = redact(text)
    assert secret not in masked and "://***@" in masked, masked


def test_a_driver_message_quoting_the_decoded_password_is_masked():
    url = "postgresql://perfscope:my p%40ss@127.0.0.1:5432/optuna"
    said = 'connection failed: password "my p@ss" was refused for user perfscope'
    assert "p@ss" not in redact(said, secrets=url_secrets(url))
