"""Where a program's values live: one device (`Placer`) or, in sharding.py, shardings over a
mesh (`ShardingPlacer`); device names as the CLI and `placement=` spell them."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..diagnostics import OiError


def resolve_device(device):
    """None | 'cpu' | 'gpu' | 'tpu' | jax.Device -> jax.Device (clear error when absent)."""
    if device is None or isinstance(device, jax.Device):
        return device
    try:
        devices = jax.devices(device)
    except RuntimeError as exc:
        raise OiError(f"device {device} is not available ({str(exc).splitlines()[0]})") from None
    if not devices:
        raise OiError(f"device {device} is not available")
    return devices[0]


class Placer:
    """Where values live: one device (default) or, in subclasses, shardings over a mesh.

    Each method takes {name: host or device array} for one role and returns device arrays;
    `jit_kwargs` adds e.g. `out_shardings` so state keeps its placement across steps."""

    def __init__(self, device=None):
        self.device = device

    def put(self, role: str, values: dict) -> dict:
        """role: 'consts' | 'state' | 'dynamic' | 'defaults'."""
        if self.device is not None:
            return jax.device_put(values, self.device)  # one batched transfer
        return {k: v if isinstance(v, jax.Array) else jnp.asarray(v) for k, v in values.items()}

    def jit_kwargs(self, program) -> dict:
        return {}

    def lazy_const(self, decl):
        """A constant placed lazily (shard by shard from the model file), or None: load it now."""
        return None

    def fetch(self, value) -> np.ndarray:
        """A device value as a full host array."""
        return np.asarray(value)


def device_name(device) -> str:
    return f"{device.platform}:{device.id}" if device is not None else "default"


def parse_device(spec):
    """A jax.Device, 'cpu', 'cpu:1', 'gpu:0' ... -> jax.Device."""
    if spec is None or isinstance(spec, jax.Device):
        return spec
    text = str(spec)
    kind, _, num = text.partition(":")
    dev = resolve_device(kind)
    if not num:
        return dev
    devices = jax.devices(kind)
    i = int(num)
    if not 0 <= i < len(devices):
        raise OiError(f"device {text} is not available ({len(devices)} {kind} device(s))")
    return devices[i]
