"""The rotary embedding of a Hugging Face config: `rope_parameters` (current transformers) or a
top-level `rope_theta` with `rope_scaling` (older files; `type` for `rope_type` in older still)
-> the inverse frequencies, f32[HD/2], exactly as transformers' ROPE_INIT_FUNCTIONS computes them
(every step rounded to f32 as torch does). The converter stores them as the model tensor
`rope.inv_freq` and the example graphs rotate with `op rope(q, pos, inv_freq)`: every rope type
is one mechanism. Types: default, linear, llama3; others (yarn, longrope, dynamic, ...) are an
error naming the key."""
from __future__ import annotations

import math

import numpy as np

from ...host_numerics import default_inv_freq
from ...diagnostics import suggest
from .config import ConfigReader, number

DEFAULT_ROPE_THETA = 10000.0  # transformers' default when a config names none
ROPE_TYPES = ("default", "linear", "llama3")


def _rope_type(cfg: ConfigReader, params: dict, key: str) -> dict:
    """`params` with an older file's `type` read as `rope_type` (transformers' standardization); a
    dict that names both, differently, is an error (no way to tell which one is meant)."""
    out = dict(params)
    if "type" in out:
        legacy = out.pop("type")
        if "rope_type" in out and out["rope_type"] != legacy:
            cfg.fail(f"{key}.rope_type is {out['rope_type']!r} but {key}.type is {legacy!r}: which one?")
        out.setdefault("rope_type", legacy)
    return out


def _params(cfg: ConfigReader) -> tuple[dict, str]:
    """The rope settings as one dict ({rope_type, rope_theta, factor, ...}) and the key they came
    from, whichever form the config uses. `rope_scaling` beside `rope_parameters` must agree with
    it: the same rope type (`type` or `rope_type`; `default` where one names none) and the same
    value of every key both hold; its keys that rope_parameters lacks (a `factor` of the same
    type) join them."""
    c = cfg.config
    params = c.get("rope_parameters")
    if params is not None:
        if not isinstance(params, dict):
            cfg.fail(f"rope_parameters must be an object, got {params!r}")
        nested = [k for k, v in params.items() if isinstance(v, dict)]
        if nested:  # keyed by layer type (transformers 5): one rope for every layer only where all agree
            if len(nested) != len(params) or any(params[k] != params[nested[0]] for k in nested):
                cfg.fail(f"rope_parameters.{nested[0]} is an object: rope_parameters keyed by layer type "
                         f"({', '.join(map(str, params))}) with different settings, where "
                         f"{cfg.config.get('model_type')} has one rotary embedding for every layer")
            params = params[nested[0]]
        out, key = _rope_type(cfg, params, "rope_parameters"), "rope_parameters"
    else:
        out, key = {}, "rope_scaling"
    scaling = c.get("rope_scaling")
    if scaling is not None:
        if not isinstance(scaling, dict):
            cfg.fail(f"rope_scaling must be an object or null, got {scaling!r}")
        scaled = _rope_type(cfg, scaling, "rope_scaling")
        if params is not None and (scaled.get("rope_type", "default") != out.get("rope_type", "default") or
                                   any(out.get(k, v) != v for k, v in scaled.items())):
            cfg.fail(f"rope_scaling {scaling!r} disagrees with rope_parameters {params!r}: which one?")
        out = {**scaled, **out}
    top = c.get("rope_theta")
    if top is not None:
        top = number(cfg.where, top, "rope_theta")
        inner = out.get("rope_theta")
        if inner is not None and number(cfg.where, inner, f"{key}.rope_theta") != top:
            cfg.fail(f"rope_theta is {top!r} but {key}.rope_theta is {float(inner)!r}: which one?")
        out["rope_theta"] = top
    return out, key


def rope_inv_freq(cfg: ConfigReader, head_dim: int) -> tuple[np.ndarray, float]:
    """(inv_freq f32[head_dim/2], rope_theta) of the config; OiError naming the key for a rope
    type or setting it cannot compute exactly."""
    params, key = _params(cfg)
    kind = params.get("rope_type", "default")
    if kind not in ROPE_TYPES:
        cfg.fail(f"{key}.rope_type is {kind!r}{suggest(str(kind), ROPE_TYPES)}: supported rope types are "
                 f"{', '.join(ROPE_TYPES)}")
    for partial in (params.get("partial_rotary_factor"), cfg.config.get("partial_rotary_factor")):
        if partial not in (None, 1.0):
            cfg.fail(f"partial_rotary_factor is {partial!r}: only a rotary embedding over the whole head (1.0) "
                     f"is supported")
    if params.get("attention_factor") not in (None, 1.0):
        cfg.fail(f"{key}.attention_factor is {params['attention_factor']!r}: only 1.0 is supported for "
                 f"rope_type {kind!r}")
    theta = params.get("rope_theta")
    if theta is None:
        theta = DEFAULT_ROPE_THETA
        cfg.notes.append(f"{cfg.where} names no rope_theta: using transformers' default {DEFAULT_ROPE_THETA}")
    theta_key = "rope_theta" if cfg.config.get("rope_theta") is not None else f"{key}.rope_theta"
    theta = number(cfg.where, theta, theta_key)
    if theta > float(np.finfo(np.float32).max):
        cfg.fail(f"{theta_key} {theta!r} is beyond f32's range (transformers computes the rotary "
                 f"frequencies in f32)")
    inv = default_inv_freq(theta, head_dim)
    f = np.float32
    if kind == "linear":  # _compute_linear_scaling_rope_parameters: inv_freq /= factor
        inv = inv / f(_setting(cfg, params, key, "factor"))
    elif kind == "llama3":  # _compute_llama3_parameters, step by step in f32
        factor = f(_setting(cfg, params, key, "factor"))
        low = _setting(cfg, params, key, "low_freq_factor")
        high = _setting(cfg, params, key, "high_freq_factor")
        old = _setting(cfg, params, key, "original_max_position_embeddings")
        if high == low:
            cfg.fail(f"{key}.high_freq_factor equals low_freq_factor ({low!r}): llama3 rope divides by their "
                     f"difference")
        low_wavelen, high_wavelen = f(old / low), f(old / high)
        wavelen = f(2 * math.pi) / inv
        scaled = np.where(wavelen > low_wavelen, inv / factor, inv).astype(f)
        smooth = ((f(old) / wavelen - f(low)) / f(high - low)).astype(f)
        smoothed = ((f(1) - smooth) * scaled / factor + smooth * scaled).astype(f)
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv = np.where(medium, smoothed, scaled).astype(f)
    return np.ascontiguousarray(inv, dtype=f), theta


def _setting(cfg: ConfigReader, params: dict, key: str, name: str) -> float:
    if params.get(name) is None:
        cfg.fail(f"missing required key {key}.{name} (rope_type {params.get('rope_type')!r})")
    return number(cfg.where, params[name], f"{key}.{name}")
