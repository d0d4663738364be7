"""Reading a model's JSON files (config.json, tokenizer.json, ...) as untrusted input.

Whatever is wrong with the file (missing, unreadable, too large, not UTF-8, not JSON, nested too
deeply, a key given twice, not an object) becomes one exception of the caller's family naming
the file, instead of the OSError, UnicodeDecodeError, JSONDecodeError or RecursionError that
json.load would let through.
"""
import json
import os

# Far above any real file of these kinds (Qwen's tokenizer.json is 7 MB), far below what would
# hurt to read: a bigger file is refused before it is read.
MAX_JSON_BYTES = 256 << 20


def _no_duplicates(pairs):
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"key {key!r} appears twice")
        obj[key] = value
    return obj


def parse_json(raw, source: str, error=ValueError):
    """The JSON value in `raw` (bytes or str); `error(message)` when it is not valid JSON."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray, memoryview)) else raw
        if text.startswith("\ufeff"):
            text = text[1:]  # a byte-order mark, which some editors write
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError as exc:
        raise error(f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except RecursionError:
        raise error(f"{source}: JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, the duplicate-key check, huge integer literals
        raise error(f"{source}: not valid JSON ({exc})") from None


def read_json(path, error=ValueError, want=dict, max_bytes=MAX_JSON_BYTES):
    """The parsed content of the JSON file `path`, which must be a `want` (dict: an object)."""
    source = os.fspath(path)
    try:
        with open(source, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise error(f"{source}: {size} bytes, more than the {max_bytes} a model's JSON file may have")
            raw = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise error(f"{source}: not found") from None
    except OSError as exc:
        raise error(f"{source}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > max_bytes:
        raise error(f"{source}: more than the {max_bytes} bytes a model's JSON file may have")
    value = parse_json(raw, source, error)
    if want is not None and not isinstance(value, want):
        kind = {dict: "object", list: "array"}.get(want, want.__name__)
        raise error(f"{source}: expected a JSON {kind}, got {_json_kind(value)}")
    return value


def _json_kind(value) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null", int: "a number", float: "a number"}.get(type(value), type(value).__name__)
