"""Sampling defaults from a model's generation_config.json, and merging them with the caller's.

Models ship the settings they were tuned for (Qwen2.5 instruct: temperature 0.7, top_p 0.8,
top_k 20, repetition_penalty 1.05) plus their EOS ids; serving engines apply them unless the
request says otherwise, and so do we. Missing settings are left out, so the sampler's own
neutral defaults apply to them.
"""
from __future__ import annotations

import math
from pathlib import Path

from ..errors import ConfigError, InvalidRequest
from .jsonfile import read_json

# Settings read from generation_config.json, under the same names.
_FLOAT_KEYS = ("temperature", "top_p", "min_p", "repetition_penalty")
_INT_KEYS = ("top_k", "max_new_tokens")

# What resolve_sampling accepts as overrides (and passes through from the defaults).
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                 "max_new_tokens", "eos_token_id", "seed")


def _short(value) -> str:
    """repr(value), cut short: a hostile file's value can be megabytes."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _eos_list(value, source: str, error=ValueError) -> list:
    ids = value if isinstance(value, (list, tuple)) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 2**31 for i in ids):
        raise error(f"{source}: eos_token_id must be a token id or a list of them, got {_short(value)}")
    return list(ids)


def load_generation_defaults(model_dir) -> dict:
    """The sampling defaults in `model_dir`/generation_config.json; {} when there is none.

    Keys (each only when the file sets it): eos_token_id (always a list), temperature, top_p,
    top_k, min_p, repetition_penalty, max_new_tokens. `do_sample: false` means greedy decoding
    in transformers whatever the temperature says, so it becomes temperature 0.
    Every value is checked here, at load (ConfigError naming the file), and again by
    resolve_sampling, which reports a bad one as the model's default.
    """
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return {}
    config = read_json(path, ConfigError)

    defaults = {}
    where = f" (in {path})"
    for key in ("eos_token_id",) + _FLOAT_KEYS + _INT_KEYS:
        if config.get(key) is not None:
            defaults[key] = _check(key, config[key], where, ConfigError)
    if config.get("do_sample") is False:
        defaults["temperature"] = 0.0
    return defaults


def _number(name, value, where, error):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise error(f"{name} must be a finite number, got {_short(value)}{where}")
    return float(value)


def _integer(name, value, where, error):
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)  # JSON writers sometimes emit 20.0
        raise error(f"{name} must be an integer, got {_short(value)}{where}")
    return value


def _check(name, value, where, error=InvalidRequest):
    """The validated (and normalized) value of one setting; `error` (a ValueError) otherwise."""
    if name == "temperature":
        value = _number(name, value, where, error)
        if value < 0:
            raise error(f"temperature must be >= 0 (0 means greedy), got {value}{where}")
    elif name == "top_p":
        value = _number(name, value, where, error)
        if not 0 < value <= 1:
            raise error(f"top_p must be in (0, 1] (1 turns it off), got {value}{where}")
    elif name == "top_k":
        value = _integer(name, value, where, error)
        if value < 0:
            raise error(f"top_k must be >= 0 (0 turns it off), got {value}{where}")
    elif name == "min_p":
        value = _number(name, value, where, error)
        if not 0 <= value <= 1:
            raise error(f"min_p must be in [0, 1] (0 turns it off), got {value}{where}")
    elif name == "repetition_penalty":
        value = _number(name, value, where, error)
        if not value > 0:
            raise error(f"repetition_penalty must be > 0 (1 turns it off), got {value}{where}")
    elif name == "max_new_tokens":
        value = _integer(name, value, where, error)
        if value < 1:
            raise error(f"max_new_tokens must be >= 1, got {value}{where}")
    elif name == "eos_token_id":
        value = _eos_list(value, f"eos_token_id{where}", error)
    elif name == "seed":
        value = _integer(name, value, where, error)
        if not 0 <= value < 2**128:
            raise error(f"seed must be in [0, 2**128), got {value}{where}")
    return value


def resolve_sampling(defaults: dict, **overrides) -> dict:
    """The settings to generate with: `defaults` (from load_generation_defaults) with every
    override that is not None taking precedence, all validated.

    Only keys present in either are returned; a ValueError names the bad setting, its allowed
    range, and whether it came from the call or from the model's defaults.
    """
    unknown = sorted(set(overrides) - set(SAMPLING_KEYS))
    if unknown:
        raise TypeError(f"unknown sampling option(s) {', '.join(unknown)}; "
                        f"known: {', '.join(SAMPLING_KEYS)}")
    merged = {}
    for name, value in defaults.items():
        merged[name] = _check(name, value, " (from the model's generation_config.json)", ConfigError)
    for name, value in overrides.items():
        if value is not None:
            merged[name] = _check(name, value, "", InvalidRequest)
    return merged
