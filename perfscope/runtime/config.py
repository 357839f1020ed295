"""The acceleration configuration: one validated dataclass, loaded from YAML, a dict or the env.

This module imports no torch, so the tuner and the CLI can read and check configurations
anywhere. ``docs/runtime.md`` documents every key.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from pathlib import Path

import yaml

from perfscope.errors import PerfscopeError
from perfscope.text import safe, short_repr

CONFIG_ENV = "PERFSCOPE_CONFIG"  # path of the configuration a tuning trial runs with


def config_env_of(path: str | None) -> dict[str, str]:
    """The environment entry that makes ``perfscope.accelerate(config=None)`` in a child process
    read the configuration at ``path`` (``{}`` for None)."""
    return {} if path is None else {CONFIG_ENV: path}

AMP_LEVELS = ("O0", "O1", "O2")
AMP_DTYPES = ("bf16", "fp16")
GRAD_COMPRESSIONS = ("none", "fp16", "bf16")
OPTIMIZERS = ("lamb", "lars")
# torch.optim's three implementations of one update (perfscope.runtime.optimizer_impl)
OPTIMIZER_IMPLS = ("for-loop", "foreach", "fused")
# learning-rate rules for a larger batch (perfscope.runtime.batch)
LR_SCALINGS = ("linear", "sqrt", "none")
MAX_BATCH_SIZE = 1 << 20
# torch.compile's modes (perfscope.runtime.compile); "off" runs the model eagerly
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune-no-cudagraphs")
# Sane ranges of the numeric knobs (docs/runtime.md): far above any real setting, low enough that
# a typo (10**12 workers) is an error here, not a fork bomb or an allocation failure later.
MAX_WORKERS = 1024
MAX_PREFETCH_FACTOR = 128
MAX_BUCKET_CAP_MB = 10240.0  # 10 GiB
MAX_GRAD_ACCUM_STEPS = 1024
MAX_THREADS = 1024
MAX_CONFIG_BYTES = 64 * 1024  # a configuration is a few hundred bytes


class ConfigError(PerfscopeError, ValueError):
    """A configuration names an unknown key, a bad value, or an impossible combination."""


class NotAConfigError(ConfigError):
    """The file is not a configuration at all (not YAML or JSON, not a mapping, keys that are
    not names, not a regular file): said as ``not a configuration file: PATH``, nothing of its
    content echoed."""


@dataclasses.dataclass(kw_only=True, frozen=True)
class AccelConfig:
    """What the runtime applies. ``None`` keeps the script's own setting for that knob.

    Attributes:
        num_workers: DataLoader worker processes (>= 0).
        pin_memory: Page-locked host batches, so host-to-device copies can be asynchronous.
        prefetch_factor: Batches each worker loads ahead (>= 1; needs num_workers > 0).
        persistent_workers: Keep workers alive across epochs (needs num_workers > 0).
        intra_op_threads: Threads of the training process's CPU operators
            (``torch.set_num_threads``, >= 1); they share the cores with the DataLoader's workers
            (:mod:`perfscope.runtime.threads`).
        device_prefetch: Copy the next batch to the GPU on a side stream during the current
            step (a documented no-op on CPU).
        amp_level: ``O0`` fp32; ``O1`` autocast in forward; ``O2`` half-precision weights with
            fp32 master weights in the optimizer and fp32 norm layers.
        amp_dtype: ``bf16`` or ``fp16`` (fp16 uses gradient scaling).
        tf32: Allow TF32 for fp32 matmuls and convolutions (Ampere and newer GPUs).
        cudnn_benchmark: Let cuDNN pick the fastest convolution algorithms per shape.
        bucket_cap_mb: DDP gradient bucket size in MiB (> 0).
        hierarchical_allreduce: Reduce within each node first, then across nodes.
        grad_compression: ``none``, ``fp16`` or ``bf16``: PyTorch's DDP compression hooks.
        grad_accum_steps: Micro-batches per optimizer step (>= 1); gradients are synchronised
            on the last one only.
        static_graph: Tell DDP the graph does not change between iterations.
        reshard_after_forward: Passed to every FSDP2 ``fully_shard`` call of the script (``False``
            keeps the gathered parameters after forward: no all-gather in backward, more memory;
            :mod:`perfscope.runtime.groups.sharding`); None keeps the script's.
        fused_ops: Swap fused operators into the model (``fused_ops.swap``: Swin-style window
            attention).
        optimizer: ``lamb`` or ``lars``: a large-batch optimizer in place of the script's Adam /
            AdamW or SGD, its learning rate scaled with ``grad_accum_steps``
            (:mod:`perfscope.runtime.groups.fused`); None keeps the script's.
        optimizer_impl: ``for-loop``, ``foreach`` or ``fused``: the kernels the script's own
            ``torch.optim`` optimizer steps with (:mod:`perfscope.runtime.optimizer_impl`);
            None keeps the script's.
        channels_last: Convert the model's weights and its 4-D inputs to the channels-last
            memory format (:mod:`perfscope.runtime.memory_format`; convolutional models).
        compile: ``off``, or the ``torch.compile`` mode the model's forward is compiled with
            (``default``, ``reduce-overhead``: CUDA graphs, ``max-autotune-no-cudagraphs``;
            :mod:`perfscope.runtime.compile`).
    """

    num_workers: int | None = None
    pin_memory: bool | None = None
    prefetch_factor: int | None = None
    persistent_workers: bool | None = None
    intra_op_threads: int | None = None
    device_prefetch: bool = False
    amp_level: str = "O0"
    amp_dtype: str = "bf16"
    tf32: bool | None = None
    cudnn_benchmark: bool | None = None
    bucket_cap_mb: float | None = None
    hierarchical_allreduce: bool = False
    grad_compression: str = "none"
    grad_accum_steps: int = 1
    static_graph: bool = False
    reshard_after_forward: bool | None = None
    fused_ops: bool = False
    optimizer: str | None = None
    optimizer_impl: str | None = None
    channels_last: bool = False
    compile: str = "off"
    batch_size: int | None = None
    lr_scaling: str = "linear"

    def __post_init__(self) -> None:
        for keys, ok, allowed in _RULES:
            for key in keys:
                if not ok(getattr(self, key)):
                    raise ConfigError(f"config key {key!r}: got {kind_of(getattr(self, key))}, allowed: {allowed}")
        if self.num_workers == 0:
            for key in ("prefetch_factor", "persistent_workers"):
                if getattr(self, key):
                    raise ConfigError(f"config key {key!r} needs num_workers > 0 (DataLoader loads in the main process with 0)")

    def to_dict(self) -> dict:
        """The configuration as a plain dict (YAML-ready)."""
        return dataclasses.asdict(self)

    def changes(self) -> dict:
        """Only the keys that differ from the defaults (what the runtime will change)."""
        default = AccelConfig()
        return {k: v for k, v in self.to_dict().items() if v != getattr(default, k)}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_in(low: int, high: int, *, optional: bool = True):
    """A check for an integer from low to high (None too, where optional)."""
    return lambda v: (optional and v is None) or (_is_int(v) and low <= v <= high)


def _one_of(choices, *, optional: bool = False):
    return lambda v: (optional and v is None) or v in choices


# Every key's rule, in the order they are checked: (keys, check, what is allowed, as said).
_RULES = (
    (("pin_memory", "persistent_workers", "tf32", "cudnn_benchmark", "reshard_after_forward"), lambda v: v is None or isinstance(v, bool),
     "true, false or null"),
    (("device_prefetch", "hierarchical_allreduce", "static_graph", "fused_ops", "channels_last"),
     lambda v: isinstance(v, bool), "true or false"),
    (("num_workers",), _int_in(0, MAX_WORKERS), f"an integer >= 0 and <= {MAX_WORKERS}"),
    (("prefetch_factor",), _int_in(1, MAX_PREFETCH_FACTOR), f"an integer >= 1 and <= {MAX_PREFETCH_FACTOR}"),
    (("intra_op_threads",), _int_in(1, MAX_THREADS), f"an integer >= 1 and <= {MAX_THREADS}"),
    (("amp_level",), _one_of(AMP_LEVELS), ", ".join(AMP_LEVELS)),
    (("amp_dtype",), _one_of(AMP_DTYPES), ", ".join(AMP_DTYPES)),
    (("bucket_cap_mb",), lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)
                                                  and 0 < v <= MAX_BUCKET_CAP_MB),
     f"a number > 0 and <= {MAX_BUCKET_CAP_MB:g} (MiB)"),
    (("optimizer",), _one_of(OPTIMIZERS, optional=True), ", ".join(OPTIMIZERS) + " or null"),
    (("optimizer_impl",), _one_of(OPTIMIZER_IMPLS, optional=True), ", ".join(OPTIMIZER_IMPLS) + " or null"),
    (("batch_size",), _int_in(1, MAX_BATCH_SIZE), f"an integer >= 1 and <= {MAX_BATCH_SIZE} or null"),
    (("lr_scaling",), _one_of(LR_SCALINGS), ", ".join(LR_SCALINGS)),
    (("compile",), _one_of(COMPILE_MODES), ", ".join(COMPILE_MODES)),
    (("grad_compression",), _one_of(GRAD_COMPRESSIONS), ", ".join(GRAD_COMPRESSIONS)),
    (("grad_accum_steps",), _int_in(1, MAX_GRAD_ACCUM_STEPS, optional=False),
     f"an integer >= 1 and <= {MAX_GRAD_ACCUM_STEPS}"),
)

KEYS = tuple(f.name for f in dataclasses.fields(AccelConfig))


def config_from_dict(data: dict) -> AccelConfig:
    """Build and validate a configuration from a mapping.

    Raises:
        ConfigError: not a mapping, unknown keys (named, with the allowed ones), bad values.
    """
    if not isinstance(data, dict):
        raise NotAConfigError(f"not a configuration file: a configuration is a mapping of keys to values, "
                              f"this holds {kind_of(data)}")
    unknown = sorted((k for k in data if k not in KEYS), key=str)  # keys of YAML may be numbers
    if any(not _looks_like_key(k) for k in unknown):
        # "root:$6$...:::" is a YAML mapping too: a line of another kind of file, never echoed.
        raise NotAConfigError("not a configuration file: its keys are not configuration keys")
    if unknown:
        shown = ", ".join(short_repr(k, SHOWN_KEY_CHARS) for k in unknown[:5])
        more = f" and {len(unknown) - 5:,} more" if len(unknown) > 5 else ""
        raise ConfigError(f"unknown config key(s) {shown}{more}; allowed keys: {', '.join(KEYS)}")
    return AccelConfig(**data)


SHOWN_KEY_CHARS = 32
"""An unknown key is named in an error message cut to this many characters (quotes included)."""
# What a configuration's key looks like: a name of letters, digits, '_', '-' and '.', up to 64
# characters. Anything else (a line of a password file, a sentence) means another kind of file.
_KEY = re.compile(r"[A-Za-z_][\w.\-]{0,63}")


def _looks_like_key(key) -> bool:
    """A name, or a YAML number or boolean (a mistyped key, short, safe to name)."""
    return _KEY.fullmatch(key) is not None if isinstance(key, str) else isinstance(key, (int, float))


def kind_of(value) -> str:
    """What ``value`` is, for an error message that must not print it: ``a string``, ``an integer``,
    ``a number``, ``true or false``, ``null``, ``a list``, ``a mapping`` (else its type's name).
    A configuration file can be any file the user points at; its values are never echoed."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    for kinds, said in ((int, "an integer"), (float, "a number"), (str, "a string"), ((list, tuple), "a list"),
                        (dict, "a mapping")):
        if isinstance(value, kinds):
            return said
    return type(value).__name__


def load_config(config: str | os.PathLike | dict | AccelConfig | None) -> AccelConfig | None:
    """The configuration to apply.

    Args:
        config: An :class:`AccelConfig`, a dict, a YAML file path, or None: then the path in
            ``$PERFSCOPE_CONFIG`` if set, else nothing to apply.

    Returns:
        The validated configuration, or None when there is none.

    Raises:
        ConfigError: ``config`` of another type, an unreadable, too large or invalid YAML file
            (anchors and aliases are refused: :func:`read_yaml`), unknown keys or bad values.
    """
    if config is None:
        path = os.environ.get(CONFIG_ENV)
        if not path:
            return None
        try:
            return load_config(path)
        except ConfigError as e:  # say where the path came from: the user may never have passed one
            raise ConfigError(f"${CONFIG_ENV} ({path}): {e}") from None
    if isinstance(config, AccelConfig):
        return config
    if isinstance(config, dict):
        return config_from_dict(config)
    if not isinstance(config, (str, os.PathLike)) or isinstance(config, bytes):
        raise ConfigError(f"config must be a YAML file path, a dict or an AccelConfig, got {type(config).__name__}")
    path = Path(config)
    data = read_yaml(path)
    try:
        return config_from_dict({} if data is None else data)  # an empty file is an empty mapping; 0 is not
    except NotAConfigError as e:
        raise NotAConfigError(f"not a configuration file: {safe(path)} ({str(e).partition(': ')[2]})") from None
    except ConfigError as e:
        raise ConfigError(f"{safe(path)}: {e}") from None


class _AnchorError(yaml.MarkedYAMLError):
    """An anchor, an alias or a repeated key in a configuration file (reported as it is)."""


class _NoAliasLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses anchors and aliases: a configuration never needs them, and
    nested aliases expand a few hundred bytes into gigabytes (the "billion laughs")."""

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _AnchorError(None, None, "YAML anchors and aliases (&name, *name) are not allowed in a "
                               "configuration; write each value out", event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        # A key given twice is a mistake (an edit that left the old line): YAML would keep the last.
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise _AnchorError(None, None, f"config key {short_repr(key, 40)} is given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_yaml(path: str | os.PathLike):
    """The YAML document of a configuration file, read safely.

    At most :data:`MAX_CONFIG_BYTES` are read, with ``yaml.SafeLoader`` minus anchors and
    aliases, so neither a huge file nor an alias bomb can take the memory or the time.

    Args:
        path: The file.

    Returns:
        The document (a dict, list, scalar, or None for an empty file).

    Raises:
        ConfigError: unreadable, too large, not valid YAML, anchors or aliases; one line naming
            the file (and the line, where YAML says it).
    """
    path = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO with no writer returns at once, so that it is refused below
        # instead of hanging; a regular file reads as always.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise ConfigError(f"cannot read configuration {safe(path)}: {e.strerror or e}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a folder, a FIFO, a device, a socket
        os.close(fd)
        raise NotAConfigError(f"not a configuration file: {safe(path)} (not a regular file)")
    with open(fd, "rb", closefd=True) as f:
        try:
            text = f.read(MAX_CONFIG_BYTES + 1)
        except OSError as e:
            raise ConfigError(f"cannot read configuration {safe(path)}: {e.strerror or e}") from None
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{safe(path)}: too large for a configuration (more than {MAX_CONFIG_BYTES // 1024} KiB)")
    try:
        return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader, minus aliases
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}: " if mark is not None else ""
        what = safe(e.problem or e.context or "error")[:80]  # YAML's words; at most a token of the file
        if isinstance(e, _AnchorError):
            raise ConfigError(f"{safe(path)}: {where}{what}") from None
        raise NotAConfigError(f"not a configuration file: {safe(path)} (not valid YAML: {where}{what})") from None
    except yaml.YAMLError:  # e.g. bytes that are not UTF-8
        raise NotAConfigError(f"not a configuration file: {safe(path)} (not valid YAML: not UTF-8 text)") from None
    except RecursionError:  # thousands of nested brackets
        raise NotAConfigError(f"not a configuration file: {safe(path)} (not valid YAML: nested too deeply)") from None


def save_config(config: AccelConfig, path: str | os.PathLike, comment: str = "", *, only_changes: bool = False) -> Path:
    """Write ``config`` as YAML (atomically) that :func:`load_config` reads back.

    Args:
        only_changes: Write only the keys that differ from the defaults (an empty mapping when
            nothing changes), so the file says what applying it does.
    """
    from perfscope.atomic import write_text_atomic

    head = "".join(f"# {line}\n" for line in comment.splitlines())
    data = config.changes() if only_changes else config.to_dict()
    return write_text_atomic(path, head + yaml.safe_dump(data, sort_keys=False))
