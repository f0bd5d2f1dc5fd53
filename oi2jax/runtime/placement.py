"""Where a program's values live: one device (`Placer`) or, in sharding.py, shardings over a
mesh (`ShardingPlacer`); device names as the CLI and `placement=` spell them."""
from __future__ import annotations

import ctypes
import functools
from types import MappingProxyType

import jax
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


# The XLA options every jit of a program's kernels gets on a CPU (`Placer.jit_options`). XLA's CPU
# compiler orders a step's work for concurrency by default, so work that does not depend on each
# other may all be live at once: a 512-token prompt step of a 135M Q4_1 Llama held 496 MB of
# temporaries (every layer's dequantized weights). The memory-optimized order held 25 MB, ran that
# step 10-20% faster and a decode step as fast, and compiles as fast (docs/performance.md, "Memory").
CPU_COMPILER_OPTIONS = MappingProxyType({"xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"})


class Placer:
    """Where values live: one device (default) or, in subclasses, shardings over a mesh.

    `put` takes {name: host or device array} for one role and returns device arrays, `put_state`
    a whole step state; `jit_kwargs` adds e.g. `out_shardings` so state keeps its placement
    across steps."""

    def __init__(self, device=None):
        self.device = device

    def put(self, role: str, values: dict, names: dict | None = None, sources: dict | None = None) -> dict:
        """role: 'consts' | 'dynamic' | 'defaults'; `names`: the IR name of a key that is not one
        (a family's member `W[3]`: W), where placement depends on the variable. `sources`: where
        a key's value comes from when another key's may come from there too (a constant's model
        tensor, after the model's aliases: `Program._const_values`); keys of one source (a tied
        embedding bound through a model alias) are placed once and share the buffer."""
        sources = sources or {}
        if self.device is not None:
            return _once(values, sources, lambda v: jax.device_put(v, self.device))  # one batched transfer
        # jax.device_put, not jnp.asarray: in JAX 0.10 jnp.asarray compiles a `jit(stage)` per
        # shape (about 50-80 ms each on CPU: half a second of a Llama's time to first token).
        # Device arrays stay where they are; the host ones go in one batched transfer.
        host = {k: v for k, v in values.items() if not isinstance(v, jax.Array)}
        return {**values, **_once(host, sources, jax.device_put)} if host else dict(values)

    def put_state(self, state):
        """A host `StepState` (lowering/state.py) on the device, in one batched transfer."""
        if self.device is not None:
            return jax.device_put(state, self.device)
        return jax.tree.map(lambda v: v if isinstance(v, jax.Array) else jax.device_put(v), state)

    def jit_kwargs(self, exe) -> dict:
        """`jax.jit` arguments for executable `exe`'s pure step (shardings; none on one device)."""
        return {}

    def platform(self) -> str:
        """The platform the program's kernels compile for (its device's, else JAX's default)."""
        return self.device.platform if self.device is not None else jax.default_backend()

    def jit_options(self) -> dict:
        """`jax.jit` arguments of EVERY kernel of the program (`CPU_COMPILER_OPTIONS` on a CPU)."""
        return jit_options(self.platform())

    def lazy_const(self, decl):
        """A constant placed lazily (shard by shard from the model file), or None: load it now."""
        return None

    def fetch(self, value) -> np.ndarray:
        """A device value as a full host array."""
        return np.asarray(value)


def jit_options(platform: str) -> dict:
    """The `jax.jit` arguments oi2jax compiles a kernel for `platform` with."""
    return {"compiler_options": dict(CPU_COMPILER_OPTIONS)} if platform == "cpu" and _cpu_options_known() else {}


@functools.cache
def _cpu_options_known() -> bool:
    """Whether this jaxlib's XLA knows `CPU_COMPILER_OPTIONS` (older ones reject the option by
    name, and every compile with it would fail): one trivial compile per process, on the CPU."""
    try:
        cpu = jax.devices("cpu")[0]
        jax.jit(lambda v: v, compiler_options=dict(CPU_COMPILER_OPTIONS)).lower(
            jax.ShapeDtypeStruct((), np.float32, sharding=jax.sharding.SingleDeviceSharding(cpu))).compile()
    except Exception:  # noqa: BLE001 (an unknown option or value: JaxRuntimeError INVALID_ARGUMENT)
        return False
    return True


def _once(values: dict, sources: dict, put) -> dict:
    """`put(dict)` of `values` with the keys of one source (`sources`; a key without one is its
    own) put once, sharing the result."""
    first: dict = {}  # source -> the key put for it
    for k in values:
        first.setdefault(sources.get(k, k), k)
    placed = put({k: values[k] for k in first.values()})
    return {k: placed[first[sources.get(k, k)]] for k in values}


# When giving pages back is worth a `malloc_trim` (a few ms in a process whose heap is large,
# every call): after placing at least this many bytes of constants read on the host (a model's
# weights), or after an XLA compilation of at least this long (a big program: a working set of
# tens to hundreds of MB). A small compilation's few MB stay for malloc to reuse.
TRIM_AFTER_BYTES = 16 << 20
TRIM_AFTER_SECONDS = 0.25


def return_freed_memory() -> None:
    """Give the heap pages freed so far back to the operating system (glibc's `malloc_trim`;
    nothing where the C library has none). Large host arrays freed after they were copied to the
    device otherwise stay in the process's heap, and the XLA compilations that follow grow the
    peak on top of them. Called where the freed part is large (`TRIM_AFTER_BYTES`,
    `TRIM_AFTER_SECONDS`)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError, TypeError):
        pass


def device_name(device) -> str:
    """How traces and messages name a device: its own platform and id (`cpu:0`, `gpu:1`)."""
    return f"{device.platform}:{device.id}" if device is not None else "default"


GPU_PLATFORMS = ("cuda", "rocm")  # what JAX's device platform "gpu" stands for when lowering


def lowering_platform(platform) -> str:
    """The platform name JAX lowers and exports for (`cpu`, `cuda`, `rocm`, `tpu`), from a
    device, a backend name or a device platform name. The one mapping: JAX names every GPU
    device and backend `gpu` (`jax.devices()[0].platform`, `jax.default_backend()`), while
    `jax.export` records and checks the lowering platform (`cuda` or `rocm`); an artifact
    exported for `gpu` is refused where it runs ("exported for platforms ('gpu',) but it is
    used on ('cuda',)"). `gpu` becomes the GPU platform present here."""
    name = platform.platform if isinstance(platform, jax.Device) else str(platform)
    if name != "gpu":
        return name
    for candidate in GPU_PLATFORMS:
        try:
            if jax.devices(candidate):
                return candidate
        except RuntimeError:  # that backend is not present
            continue
    raise OiError(f"platform gpu: no GPU is present to tell which one; name the lowering platform "
                  f"({' or '.join(GPU_PLATFORMS)})")


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
