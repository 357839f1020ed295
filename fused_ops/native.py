"""The CPU kernel of window attention (``fused_ops/csrc/window_attention.cpp``): built on first use
with the machine's C++ compiler, cached, and called through ctypes.

Why ctypes and not a PyTorch C++ extension: the kernel needs no PyTorch headers (it works on raw
fp32 and bf16 buffers), so it compiles in about two seconds instead of the better part of a minute, and it
loads into any PyTorch of this project's range without an ABI to match.

The build is ``$CXX`` (else ``g++``, else ``c++`` on ``PATH``; GCC: the source uses its vector
built-ins) with ``-O3 -march=native -fopenmp``:
tuned for the CPU it runs on, so the cached library is keyed by the source, the flags, the
compiler's version and this CPU's model and feature flags (``/proc/cpuinfo``) — a home folder
shared by machines of two kinds holds one library per kind. It is written to
:func:`cache_dir`, through a temporary file renamed into place, so that processes building at
once never load a half-written file.

Where no compiler is found or the build fails, :func:`kernel` returns None and :func:`status`
says why; ``fused_ops.window_attention`` then runs its ATen formulation (same results, slower).
``PERFSCOPE_NATIVE=0`` turns the kernel off.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("csrc") / "window_attention.cpp"
HEADERS = (SOURCE.with_name("tiles.h"), SOURCE.with_name("pairs.h"))  # what SOURCE includes: part of the cache key
# -fopenmp: the kernel runs on the OpenMP runtime PyTorch loaded (see parallel() in the source).
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-pthread", "-fopenmp", "-fno-math-errno")
# PERFSCOPE_NATIVE_MARCH=haswell builds for AVX2 without AVX-512 on any x86 machine (what the tests and
# the benchmark use to check that build where the CPU has more); a GCC -march name.
_MARCH = re.compile(r"[a-z][a-z0-9_.+-]{0,31}")


def flags() -> tuple[str, ...]:
    """:data:`FLAGS`, with ``-march`` from ``PERFSCOPE_NATIVE_MARCH`` where it is set.

    Raises:
        RuntimeError: the variable is not a GCC ``-march`` name.
    """
    march = os.environ.get("PERFSCOPE_NATIVE_MARCH")
    if not march:
        return FLAGS
    if not _MARCH.fullmatch(march):
        raise RuntimeError(f"PERFSCOPE_NATIVE_MARCH={march[:40]!r} is not a -march name")
    return tuple(f"-march={march}" if f == "-march=native" else f for f in FLAGS)
BUILD_TIMEOUT_S = 120  # about 2 s on an idle machine, 20 s at a load of 15 on 2 cores

_lock = threading.Lock()
_state: dict = {}
_off = 0  # > 0 inside off()


def _compiler() -> str | None:
    # GCC: the kernel uses its vector built-ins (__builtin_shuffle), and its -fopenmp binds to the
    # libgomp PyTorch loads; clang would build neither.
    for name in (os.environ.get("CXX"), "g++", "c++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_identity() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.machine() + platform.processor()
    keep = [line for line in text.splitlines() if line.split(":")[0].strip() in ("model name", "flags", "Features")]
    return platform.machine() + "\n" + "\n".join(sorted(set(keep)))


def cache_dir() -> Path:
    """Where built libraries are kept: ``$PERFSCOPE_CACHE_DIR/native``, else
    ``$XDG_CACHE_HOME/perfscope/native``, else ``~/.cache/perfscope/native``."""
    root = os.environ.get("PERFSCOPE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "perfscope")
    return Path(root) / "native"


class Untrusted(RuntimeError):
    """A cache folder or library that another user could have written: never loaded."""


def _trusted(path: Path, kind: str) -> None:
    """Refuse ``path`` unless nobody but this user could have written it: the checks ssh makes of
    ``~/.ssh`` and pip of its cache. ``kind``: ``library`` and ``cache folder`` must be this
    user's (a ``cache file`` too); a ``folder above`` them may also be root's, and may be writable by others when its
    sticky bit is set (``/tmp``: others cannot rename what is in it).

    Raises:
        Untrusted: naming the path and why.
    """
    info = os.lstat(path)
    is_folder = kind in ("cache folder", "folder above")
    if stat.S_ISLNK(info.st_mode) and kind != "folder above":
        raise Untrusted(f"{kind} {path} is a symbolic link")
    if stat.S_ISLNK(info.st_mode):  # a link's owner may repoint it (in a sticky folder too): ours or root's only
        if info.st_uid not in (os.geteuid(), 0):
            raise Untrusted(f"{kind} {path} is a link that belongs to uid {info.st_uid}, not to this user")
        info = os.stat(path)
    if stat.S_ISDIR(info.st_mode) != is_folder:
        raise Untrusted(f"{kind} {path} is not a {'folder' if is_folder else 'regular file'}")
    owners = (os.geteuid(), 0) if kind == "folder above" else (os.geteuid(),)
    if info.st_uid not in owners:
        raise Untrusted(f"{kind} {path} belongs to uid {info.st_uid}, not to this user")
    sticky = kind == "folder above" and info.st_mode & stat.S_ISVTX
    if info.st_mode & 0o022 and not sticky:
        raise Untrusted(f"{kind} {path} may be written by others (mode {stat.S_IMODE(info.st_mode):o})")


def _check_folders(folder: Path) -> None:
    """Every folder above the cache folder ``folder``, and ``folder`` itself (:func:`_trusted`),
    checked before anything is built or loaded there: once they pass, nobody else can put a file
    in the folder or move one into it.

    Raises:
        Untrusted: the first that fails.
    """
    # from the root down, so that the line names the cause: the folders on the way as named (a
    # link among them could be replaced) and as they resolve
    for above in dict.fromkeys([*folder.absolute().parents, *folder.resolve().parents]):
        _trusted(above, "folder above")
    _trusted(folder, "cache folder")
    _trusted(folder.resolve(), "cache folder")


def _make_cache_dir() -> Path:
    """:func:`cache_dir`, each folder it creates of mode 0700 (whatever the umask). Nothing is
    created under a folder that another user could have written (the folders that exist are
    checked first, as :func:`_check_folders` checks them), and the mode is set on the folder made,
    never through a link.

    Raises:
        Untrusted: an existing folder on the way fails the checks.
    """
    folder = cache_dir()
    missing = []
    for path in (folder, *folder.parents):
        if os.path.lexists(path):
            break
        missing.append(path)
    if missing:  # the deepest existing folder, and everything above it, before anything is made there
        existing = missing[-1].parent
        for above in dict.fromkeys([*existing.absolute().parents, *existing.resolve().parents,
                                    existing, existing.resolve()]):
            _trusted(above, "folder above")
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                os.fchmod(fd, 0o700)
            finally:
                os.close(fd)
    return folder


def _run(command: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    """``command`` in a process group of its own; on timeout the whole group is killed (a
    compiler's children too) before :class:`subprocess.TimeoutExpired` is raised."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _open(path: str) -> ctypes.CDLL:
    """The library at ``path`` with its entry points typed.

    Raises:
        OSError: it does not load; AttributeError: an entry point is missing.
    """
    lib = ctypes.CDLL(path)
    i64, i32, f32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    for suffix in ("", "_bf16"):
        fwd, bwd = getattr(lib, "wa_forward" + suffix), getattr(lib, "wa_backward" + suffix)
        fwd.argtypes = [ptr, ptr, ptr, ptr, ptr, ptr, i64, i32, i32, i32, i32, f32, ptr, ptr, i32]
        bwd.argtypes = [ptr, ptr, ptr, ptr, ptr, ptr, i64, i32, i32, i32, f32, ptr, ptr, ptr, ptr, i32]
        fwd.restype = bwd.restype = i32
    return lib


def _target(cxx: str) -> Path:
    version = _run([cxx, "--version"], 30).stdout
    sources = [path.read_text() for path in (SOURCE, *HEADERS)]
    key = hashlib.sha256("\0".join([*sources, " ".join(flags()), version, _cpu_identity()]).encode())
    return cache_dir() / f"window_attention-{key.hexdigest()[:16]}.so"


def _build(cxx: str, target: Path) -> None:
    """Compile into a private temporary file beside ``target``, load it and find its entry points,
    then rename it into place: a library that does not load is never cached.

    Raises:
        RuntimeError: the compiler failed or its output does not load.
        subprocess.TimeoutExpired: it ran past :data:`BUILD_TIMEOUT_S` (its process group killed).
    """
    fd, tmp = tempfile.mkstemp(prefix=target.stem + ".", suffix=".tmp.so", dir=target.parent)  # mode 0600
    os.close(fd)
    try:
        done = _run([cxx, *flags(), str(SOURCE), "-o", tmp], BUILD_TIMEOUT_S)
        if done.returncode:
            lines = (done.stderr or done.stdout).strip().splitlines()
            raise RuntimeError(f"{Path(cxx).name} failed: {lines[-1] if lines else f'exit {done.returncode}'}")
        os.chmod(tmp, 0o700)  # the linker wrote a file of its own, with the umask's mode
        try:
            _open(tmp)
        except (OSError, AttributeError) as e:
            raise RuntimeError(f"{Path(cxx).name} made a library that does not load: {_first_line(e)}") from None
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _load() -> ctypes.CDLL | None:
    if os.environ.get("PERFSCOPE_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        _state["status"] = "off (PERFSCOPE_NATIVE=0)"
        return None
    cxx = _compiler()
    if cxx is None:
        _state["status"] = "no C++ compiler ($CXX, g++ or c++) on PATH"
        return None
    try:
        _check_folders(_make_cache_dir())  # before the build: its output is loaded to check it
        target = _target(cxx)
        for attempt in (1, 2):
            if not target.exists():
                _build(cxx, target)
            _trusted(target, "library")
            try:
                lib = _open(str(target))
                _state["target"] = target.name
                break
            except (OSError, AttributeError) as e:
                if attempt == 2:
                    raise RuntimeError(f"the built library does not load: {_first_line(e)}") from None
                target.unlink()  # ours (checked above) but broken: built again once
    except Untrusted as e:
        _state["status"] = f"not loaded: {e}"
        warnings.warn(f"fused_ops: the native kernel is not loaded: {e}; the ATen formulation runs instead",
                      stacklevel=3)
        return None
    except subprocess.TimeoutExpired:
        _state["status"] = f"not built: the compiler ran past {BUILD_TIMEOUT_S} s (stopped)"
        return None
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        _state["status"] = f"not built: {_first_line(e)}"
        return None
    _state["status"] = "built"
    return lib


def kernel() -> ctypes.CDLL | None:
    """The loaded library (``wa_forward``, ``wa_backward`` for fp32, ``wa_forward_bf16``,
    ``wa_backward_bf16`` for bf16), built on the first call; None where it cannot be (see
    :func:`status`)."""
    with _lock:
        if "lib" not in _state:
            _state["lib"] = _load()
        return _state["lib"]


def status() -> str:
    """``"built"``, or why the kernel is not used (after :func:`kernel` was called); where it is
    built, each shape's choice between it and the ATen formulation so far, one line each
    (:mod:`perfscope.fused_ops.choice`)."""
    kernel()
    made = "\n".join(filter(None, (describe() for describe in _status_lines))) if _state["status"] == "built" else ""
    return _state["status"] + (f"; per shape:\n{made}" if made else "")


_status_lines: list = []  # what perfscope.fused_ops.choice adds to status() (it imports this module)


def add_status_lines(describe) -> None:
    """``describe() -> str`` is called by :func:`status` for lines of its own (the per-shape choices)."""
    if describe not in _status_lines:
        _status_lines.append(describe)


def library_name() -> str | None:
    """The loaded library's file name (its build flags, compiler and CPU are in its hash), or None."""
    kernel()
    return _state.get("target")


def check_cache_folder() -> None:
    """The cache folder and every folder above it, as the library's are checked before it loads.

    Raises:
        Untrusted: one that another user could have written.
    """
    _check_folders(_make_cache_dir())


def check_cache_file(path: Path) -> None:
    """A file of the cache folder (``path`` in it), checked as the library is before it is read.

    Raises:
        Untrusted: the folder or the file could have been written by another user (or is a link).
    """
    check_cache_folder()
    _trusted(path, "cache file")


@contextlib.contextmanager
def off():
    """Run the ATen formulation inside the block, kernel or not (the tests and the benchmark
    compare both). Not thread-local: for tests and measurements, not for a server."""
    global _off
    _off += 1
    try:
        yield
    finally:
        _off -= 1


VECTOR = 16  # floats per vector in the kernel (its W): head_dim in whole vectors, score rows padded to them
# The backward's per-thread bias-gradient sums take threads x heads x N x NP floats; above this
# the ATen formulation runs instead (Swin's 7 x 7 windows need well under 1 MiB).
MAX_SCRATCH_BYTES = 256 << 20
# The storage types the kernel reads and writes (fp32 arithmetic; bf16 products on bf16 pairs where the
# CPU has AVX512-BF16, see docs/fused_ops.md).
DTYPES = (torch.float32, torch.bfloat16)


def _fits(q, *others) -> bool:
    # the kernel's own shapes_fit, checked here so that what it refuses runs the ATen formulation
    _, heads, n, d = q.shape
    return (not _off and q.device.type == "cpu" and q.dtype in DTYPES and d % VECTOR == 0 and 0 < d <= 256
            and 0 < n <= 1024 and heads > 0
            and all(t.device == q.device and t.dtype == q.dtype and t.shape == q.shape for t in others))


def usable(q, k, v, bias, mask) -> bool:
    """Whether the kernel takes the forward's inputs: ``q``, ``k``, ``v`` on the CPU, of one
    shape and one dtype of :data:`DTYPES`, ``head_dim`` a multiple of 16 up to 256, ``N`` up to 1024, ``bias`` ``(heads, N, N)``,
    ``mask`` ``(nW, N, N)`` with ``nW`` dividing ``B * nW``, and the library built (not inside
    :func:`off`). Anything else runs the ATen formulation (which raises for what it cannot take)."""
    if q.dim() != 4 or not _fits(q, k, v):
        return False
    bw, heads, n, _ = q.shape
    if bias.shape != (heads, n, n) or bias.device != q.device:
        return False
    if mask is not None and (mask.dim() != 3 or mask.shape[1:] != (n, n) or mask.shape[0] == 0
                             or bw % mask.shape[0] or mask.device != q.device):
        return False
    return kernel() is not None


def usable_backward(grad_out, q, k, v, probs) -> bool:
    """Whether the kernel takes the backward's inputs (as :func:`usable`, ``probs``
    ``(B * nW, heads, N, N)`` of ``q``'s dtype, and its scratch within :data:`MAX_SCRATCH_BYTES`)."""
    if q.dim() != 4 or not _fits(q, k, v, grad_out):
        return False
    bw, heads, n, _ = q.shape
    padded = -(-n // VECTOR) * VECTOR
    if probs.shape != (bw, heads, n, n) or probs.dtype != q.dtype or probs.device != q.device:
        return False
    if torch.get_num_threads() * heads * n * padded * 4 > MAX_SCRATCH_BYTES:
        return False
    return kernel() is not None


def _rows(t):
    """``t`` if the kernel can read it in place (unit stride along ``head_dim``, a token stride from
    1 to 2^20, so that stride x N fits the kernel's int indexing: the views Swin takes of its qkv
    projection), else a contiguous copy."""
    return t if t.stride(3) == 1 and 1 <= t.stride(2) <= 1 << 20 and min(t.stride()) >= 0 else t.contiguous()


def _strides(q, k, v):
    """The kernel's ``strides[9]``: window, head and token strides of ``q``, ``k``, ``v`` (elements)."""
    return (ctypes.c_int64 * 9)(*[x for t in (q, k, v) for x in t.stride()[:3]])


def _check(rc: int, q) -> None:
    if rc == 2:
        raise MemoryError(f"window attention kernel: out of memory for shape {tuple(q.shape)}")
    if rc:
        raise RuntimeError(f"window attention kernel refused shape {tuple(q.shape)}")


def _entry(name: str, dtype):
    return getattr(kernel(), name if dtype == torch.float32 else name + "_bf16")


def forward(q, k, v, bias, mask, scale: float):
    """``(out, probs)`` of the forward for ``q``, ``k``, ``v`` ``(B * nW, heads, N, D)`` of one dtype
    of :data:`DTYPES` (views read in place where :func:`_rows` allows, the results contiguous and of
    that dtype), ``bias`` ``(heads, N, N)`` and ``mask`` ``(nW, N, N)`` or None (any dtype: read as
    fp32); ``probs`` ``(B * nW, heads, N, N)``. The kernel adds the bias and the mask per window
    itself; its arithmetic is fp32 (bf16: products of bf16 pairs accumulated in fp32 on CPUs with
    AVX512-BF16, else the values widened; results rounded to nearest even).

    Raises:
        RuntimeError: the kernel refused the shapes (call :func:`usable` first).
        MemoryError: its scratch memory could not be allocated.
    """
    q, k, v = _rows(q), _rows(k), _rows(v)
    bw, heads, n, d = q.shape
    windows = 1 if mask is None else mask.shape[0]
    bias = bias.to(torch.float32).contiguous()
    mask = None if mask is None else mask.to(torch.float32).contiguous()
    out, probs = q.new_empty(q.shape), q.new_empty((bw, heads, n, n))
    _check(_entry("wa_forward", q.dtype)(q.data_ptr(), k.data_ptr(), v.data_ptr(), _strides(q, k, v), bias.data_ptr(),
                               None if mask is None else mask.data_ptr(), bw * heads, heads, n, d, windows, scale,
                               out.data_ptr(), probs.data_ptr(), torch.get_num_threads()), q)
    return out, probs


def backward(grad_out, q, k, v, probs, scale: float):
    """``(grad_q, grad_k, grad_v, grad_bias)`` for tensors as :func:`forward`'s (``grad_out`` and
    ``probs`` of ``q``'s dtype), the gradients of that dtype; ``grad_bias`` ``(heads, N, N)`` fp32,
    summed over every window.

    Raises:
        RuntimeError: the kernel refused the shapes (call :func:`usable_backward` first).
        MemoryError: its scratch memory could not be allocated.
    """
    grad_out, probs = grad_out.contiguous(), probs.contiguous()
    q, k, v = _rows(q), _rows(k), _rows(v)
    bw, heads, n, d = q.shape
    grad_q, grad_k, grad_v = q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(q.shape)
    grad_bias = q.new_empty((heads, n, n), dtype=torch.float32)
    _check(_entry("wa_backward", q.dtype)(grad_out.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), _strides(q, k, v),
                                probs.data_ptr(),
                                bw * heads, heads, n, d, scale, grad_q.data_ptr(), grad_k.data_ptr(),
                                grad_v.data_ptr(), grad_bias.data_ptr(), torch.get_num_threads()), q)
    return grad_q, grad_k, grad_v, grad_bias
