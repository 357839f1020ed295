"""fused_ops.native loads only what this user built: cache folders are private, a library or
folder another user could have written is never loaded, a build is loaded and checked before
it is cached, a broken cached build is rebuilt, and a hanging compiler is stopped with its
children. Each case runs in a fresh process, as a user's first window_attention call would."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import HANG_TIMEOUT_S  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CXX = shutil.which("g++") or shutil.which("c++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler")

# The status, then whether the fallback (or kernel) still gives the twin's result.
PROBE = ("from perfscope.fused_ops import native, window_attention, window_attention_reference as ref; import torch; "
         "print(native.status()); "
         "q = torch.randn(4, 2, 9, 16); b = torch.randn(2, 9, 9); "
         "print(torch.allclose(window_attention(q, q, q, b), ref(q, q, q, b), atol=1e-5))")
PLANT = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen("%s", "w"); if (f) { fputs("ran", f); fclose(f); }
}
int wa_forward(void) { return 0; } int wa_backward(void) { return 0; }
int wa_forward_bf16(void) { return 0; } int wa_backward_bf16(void) { return 0; }
"""


def probe(env: dict, code: str = PROBE, **kwargs) -> tuple[str, str, subprocess.CompletedProcess]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, **env}, check=False, **kwargs)
    assert done.returncode == 0, done.stderr[-3000:]
    status, ok = done.stdout.splitlines()[-2:]
    return status, ok, done


def target_in(cache: Path) -> Path:
    """The library name this process would build for ``cache``."""
    code = "from perfscope.fused_ops import native; print(native._target(native._compiler()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=HANG_TIMEOUT_S,
                          env={**os.environ, "PERFSCOPE_CACHE_DIR": str(cache)}, check=True)
    return Path(done.stdout.strip())


def plant(path: Path, marker: Path, uid: int | None = None) -> None:
    """A library whose constructor writes ``marker``, at ``path`` (written as ``uid``)."""
    source = path.parent / "planted.c"
    build = path.parent / "planted.so"
    source.write_text(PLANT % marker)
    subprocess.run(["gcc", "-shared", "-fPIC", str(source), "-o", str(build)], check=True)
    source.unlink()
    if uid is None:
        build.rename(path)
        return
    os.chmod(build, 0o644)
    subprocess.run(["cp", str(build), str(path)], check=True, user=uid)  # another user writes it
    build.unlink()


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting as another uid needs root")


@pytest.fixture
def shared_tmp():
    """A folder others can reach (pytest's own is private to this user)."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="perfscope-shared-", dir="/tmp"))
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@needs_root
def test_a_library_planted_by_another_user_in_a_shared_cache_folder_is_never_loaded(shared_tmp):
    # A team-shared cache folder, or one made under umask 000: anyone may write into it.
    tmp_path = shared_tmp
    cache = tmp_path / "cache"
    (cache / "native").mkdir(parents=True)
    os.chmod(cache, 0o777)
    os.chmod(cache / "native", 0o777)
    target = target_in(cache)
    marker = tmp_path / "marker"
    plant(target, marker, uid=65534)
    status, ok, done = probe({"PERFSCOPE_CACHE_DIR": str(cache)})
    assert not marker.exists(), "the planted library's constructor ran"
    assert status.startswith("not loaded: folder above") and "cache may be written by others (mode 777)" in status, status
    assert ok == "True"
    warned = [line for line in done.stderr.splitlines() if "the native kernel is not loaded" in line]
    assert len(warned) == 1 and "the ATen formulation runs instead" in warned[0], done.stderr


@needs_root
def test_a_library_owned_by_another_user_is_never_loaded(tmp_path):
    cache = tmp_path / "cache"
    (cache / "native").mkdir(parents=True, mode=0o700)
    target = target_in(cache)
    marker = tmp_path / "marker"
    plant(target, marker)
    os.chown(target, 65534, 65534)
    status, ok, done = probe({"PERFSCOPE_CACHE_DIR": str(cache)})
    assert not marker.exists()
    assert status.startswith("not loaded: library") and "belongs to uid 65534, not to this user" in status, status
    assert ok == "True"


def test_a_linked_library_is_refused(tmp_path):
    cache = tmp_path / "cache"
    (cache / "native").mkdir(parents=True, mode=0o700)
    target = target_in(cache)
    marker = tmp_path / "marker"
    plant(tmp_path / "elsewhere.so", marker)
    target.symlink_to(tmp_path / "elsewhere.so")
    status, ok, _ = probe({"PERFSCOPE_CACHE_DIR": str(cache)})
    assert not marker.exists() and status.startswith("not loaded: library") and "symbolic link" in status, status


def test_cache_folders_are_created_private_whatever_the_umask(tmp_path):
    cache = tmp_path / "a" / "b"
    status, ok, _ = probe({"PERFSCOPE_CACHE_DIR": str(cache)}, umask=0)
    assert status == "built" and ok == "True"
    for folder in (tmp_path / "a", cache, cache / "native"):
        assert oct(folder.stat().st_mode & 0o777) == oct(0o700), folder
    (lib,) = (cache / "native").glob("*.so")
    assert lib.stat().st_mode & 0o077 == 0


def _fake_compiler(tmp_path: Path, body: str) -> Path:
    cxx = tmp_path / "fake-cxx"
    cxx.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then echo fake-cxx 1; exit 0; fi\n{body}\n')
    cxx.chmod(0o755)
    return cxx


@pytest.mark.parametrize(("body", "expected"), [
    ('for a; do out=$a; done; echo garbage > "$out"', "made a library that does not load"),
    ('for a; do out=$a; done; echo "int f(void){return 0;}" > "$out.c"; ' + f'{CXX} -shared -fPIC "$out.c" -o "$out"',
     "made a library that does not load: "),
], ids=["garbage", "no-entry-points"])
def test_a_build_that_does_not_load_is_not_cached_and_the_fallback_runs(tmp_path, body, expected):
    cxx = _fake_compiler(tmp_path, body)
    cache = tmp_path / "cache"
    for _ in range(2):  # the second process does not find a cached library either
        status, ok, _ = probe({"PERFSCOPE_CACHE_DIR": str(cache), "CXX": str(cxx)})
        assert status.startswith("not built: fake-cxx " + expected), status
        assert ok == "True"
        assert not list((cache / "native").glob("*.so")), list((cache / "native").iterdir())


def test_a_broken_library_in_the_cache_is_built_again(tmp_path):
    cache = tmp_path / "cache"
    (cache / "native").mkdir(parents=True, mode=0o700)
    target = target_in(cache)
    target.write_bytes(b"garbage from an interrupted copy")
    target.chmod(0o600)
    status, ok, _ = probe({"PERFSCOPE_CACHE_DIR": str(cache)})
    assert status == "built" and ok == "True"
    assert target.read_bytes()[:4] == b"\x7fELF"


def test_a_hanging_compiler_is_stopped_with_its_children(tmp_path):
    tag = f"{uuid.uuid4().int % 10**6 + 10**6}"
    cxx = _fake_compiler(tmp_path, f"sleep {tag} &\nsleep {tag}")
    code = "from perfscope.fused_ops import native; native.BUILD_TIMEOUT_S = 2\n" + PROBE
    status, ok, _ = probe({"PERFSCOPE_CACHE_DIR": str(tmp_path / "cache"), "CXX": str(cxx)}, code=code)
    assert status == "not built: the compiler ran past 2 s (stopped)" and ok == "True", status
    left = subprocess.run(["pgrep", "-f", f"sleep {tag}"], capture_output=True, text=True, check=False).stdout
    assert left.strip() == "", f"the compiler's children still run: {left}"


@pytest.mark.parametrize("value", ["0", "OFF", "off", "False", " no "])
def test_the_kernel_can_be_turned_off_in_any_case(tmp_path, monkeypatch, value):
    from perfscope.fused_ops import native

    # Read where the library is first wanted: each spelling here, in a fresh state of this process
    # (nothing is built: the switch is read before the compiler is looked for).
    monkeypatch.setenv("PERFSCOPE_NATIVE", value)
    monkeypatch.setenv("PERFSCOPE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(native, "_state", {})
    assert native.kernel() is None and native.status() == "off (PERFSCOPE_NATIVE=0)"
    assert not list(tmp_path.iterdir())
    # A fresh process turned off, whose window attention still runs: tests/test_fused_native.py.


@needs_root
def test_nothing_is_built_or_loaded_in_a_folder_another_user_made(shared_tmp, tmp_path):
    # The build's own output is loaded to check it: in a folder another user controls, they could
    # swap it between the compiler and that check. The folder is refused before the compiler runs.
    cache = shared_tmp / "cache"
    cache.mkdir()
    os.chmod(cache, 0o755)
    (cache / "native").mkdir(mode=0o755)
    os.chown(cache / "native", 65534, 65534)  # made by another user, who may write in it
    log = tmp_path / "cxx.log"
    cxx = _fake_compiler(tmp_path, f'echo build >> {log}; exec {CXX} "$@"')
    status, ok, _ = probe({"PERFSCOPE_CACHE_DIR": str(cache), "CXX": str(cxx)})
    assert status.startswith("not loaded: cache folder") and "belongs to uid 65534" in status, status
    assert ok == "True" and not log.exists(), "the compiler ran in another user's folder"


@needs_root
def test_a_link_another_user_owns_on_the_way_to_the_cache_is_refused(shared_tmp):
    # Another user's link in a sticky folder points at this user's own, trusted cache: they can
    # repoint it between the check and the load, so it is refused whatever it points at now.
    real = shared_tmp / "mine"
    real.mkdir(mode=0o700)
    link = shared_tmp / "link"
    link.symlink_to(real)
    os.chown(link, 65534, 65534, follow_symlinks=False)
    status, ok, _ = probe({"PERFSCOPE_CACHE_DIR": str(link)})
    assert status.startswith("not loaded: folder above") and "link that belongs to uid 65534" in status, status
    assert ok == "True"


@needs_root
def test_nothing_is_created_through_a_folder_another_user_controls(shared_tmp):
    # Another user's folder holds a link to a private folder of this user's: the cache folders must
    # not be made (nor chmod-ed) through it before the checks refuse it.
    private = shared_tmp / "private"
    private.mkdir(mode=0o700)
    theirs = shared_tmp / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    (theirs / "c").symlink_to(private)
    os.chown(theirs / "c", 65534, 65534, follow_symlinks=False)
    status, ok, _ = probe({"PERFSCOPE_CACHE_DIR": str(theirs / "c" / "cache")})
    assert status.startswith("not loaded: folder above") and ok == "True", status
    assert list(private.iterdir()) == [], "a folder was made through another user's link"
