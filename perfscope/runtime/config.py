"""The acceleration configuration: one validated dataclass, loaded from YAML, a dict or the env.

This module imports no torch, so the tuner and the CLI can read and check configurations
anywhere. ``docs/runtime.md`` documents every key.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import yaml

from perfscope.errors import PerfscopeError

CONFIG_ENV = "PERFSCOPE_CONFIG"  # path of the configuration a tuning trial runs with

AMP_LEVELS = ("O0", "O1", "O2")
AMP_DTYPES = ("bf16", "fp16")
GRAD_COMPRESSIONS = ("none", "fp16", "bf16")


class ConfigError(PerfscopeError, ValueError):
    """A configuration names an unknown key, a bad value, or an impossible combination."""


@dataclasses.dataclass(kw_only=True, frozen=True)
class AccelConfig:
    """What the runtime applies. ``None`` keeps the script's own setting for that knob.

    Attributes:
        num_workers: DataLoader worker processes (>= 0).
        pin_memory: Page-locked host batches, so host-to-device copies can be asynchronous.
        prefetch_factor: Batches each worker loads ahead (>= 1; needs num_workers > 0).
        persistent_workers: Keep workers alive across epochs (needs num_workers > 0).
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
    """

    num_workers: int | None = None
    pin_memory: bool | None = None
    prefetch_factor: int | None = None
    persistent_workers: bool | None = None
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

    def __post_init__(self) -> None:
        def check(ok: bool, key: str, allowed: str) -> None:
            if not ok:
                raise ConfigError(f"config key {key!r}: got {getattr(self, key)!r}, allowed: {allowed}")

        def is_int(v) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        for key in ("pin_memory", "persistent_workers", "tf32", "cudnn_benchmark"):
            check(getattr(self, key) is None or isinstance(getattr(self, key), bool), key, "true, false or null")
        for key in ("device_prefetch", "hierarchical_allreduce", "static_graph"):
            check(isinstance(getattr(self, key), bool), key, "true or false")
        check(self.num_workers is None or (is_int(self.num_workers) and self.num_workers >= 0), "num_workers", "an integer >= 0")
        check(self.prefetch_factor is None or (is_int(self.prefetch_factor) and self.prefetch_factor >= 1),
              "prefetch_factor", "an integer >= 1")
        check(self.amp_level in AMP_LEVELS, "amp_level", ", ".join(AMP_LEVELS))
        check(self.amp_dtype in AMP_DTYPES, "amp_dtype", ", ".join(AMP_DTYPES))
        check(self.bucket_cap_mb is None or (isinstance(self.bucket_cap_mb, (int, float))
              and not isinstance(self.bucket_cap_mb, bool) and 0 < self.bucket_cap_mb < float("inf")),
              "bucket_cap_mb", "a finite number > 0 (MiB)")
        check(self.grad_compression in GRAD_COMPRESSIONS, "grad_compression", ", ".join(GRAD_COMPRESSIONS))
        check(is_int(self.grad_accum_steps) and self.grad_accum_steps >= 1, "grad_accum_steps", "an integer >= 1")
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


KEYS = tuple(f.name for f in dataclasses.fields(AccelConfig))


def config_from_dict(data: dict) -> AccelConfig:
    """Build and validate a configuration from a mapping.

    Raises:
        ConfigError: not a mapping, unknown keys (named, with the allowed ones), bad values.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"a configuration must be a mapping of keys to values, got {type(data).__name__}")
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ConfigError(f"unknown config key(s) {', '.join(map(repr, unknown))}; allowed keys: {', '.join(KEYS)}")
    return AccelConfig(**data)


def load_config(config: str | os.PathLike | dict | AccelConfig | None) -> AccelConfig | None:
    """The configuration to apply.

    Args:
        config: An :class:`AccelConfig`, a dict, a YAML file path, or None: then the path in
            ``$PERFSCOPE_CONFIG`` if set, else nothing to apply.

    Returns:
        The validated configuration, or None when there is none.

    Raises:
        ConfigError: unreadable file, invalid YAML, unknown keys or bad values.
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
    path = Path(config)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ConfigError(f"cannot read configuration {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    return config_from_dict(data or {})


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
