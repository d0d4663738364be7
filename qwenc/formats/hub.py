"""Hub ids: `OWNER/REPO[/FILE.gguf][:QUANT][@REV]` to files in the HuggingFace cache.

Downloads go through huggingface_hub into its cache (the same one transformers and llama.cpp's
`-hf` users share), with its progress bar, its resume of a broken transfer and its revision refs.
What this module adds is the choice of files:

- a safetensors repository (config.json + *.safetensors) gives the files a model directory needs:
  config.json, generation_config.json, tokenizer.json, tokenizer_config.json, the chat template
  files, the shard index and the weights it names (or model.safetensors). Never the *.bin / *.pth
  / ONNX duplicates, the README, or anything in a subfolder.
- a GGUF repository gives one quantization: `:QUANT` names it (matched against the quantization
  label in the file names, case-insensitive), `/FILE.gguf` names a file, and with neither the repo's
  only GGUF is taken, else its Q4_K_M. A model split into `-00001-of-0000N.gguf` parts gets all
  of its parts (qwenc.formats.gguf reads them as one).
- `@REV` pins a branch, tag or commit.

The environment is read at each call, with huggingface_hub's meaning: HF_ENDPOINT (the hub),
HF_HUB_CACHE / HF_HOME (the cache), HF_TOKEN (private and gated repos), HF_HUB_OFFLINE (the cache
only). With the hub unreachable, what is cached is used. Nothing is fetched that is already cached
at the resolved commit; a pinned commit whose files are all cached makes no request at all.
"""
import glob
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelFormatError, ModelNotFound

DEFAULT_QUANT = "Q4_K_M"
DEFAULT_REVISION = "main"
DEFAULT_ENDPOINT = "https://huggingface.co"

# Files of a model directory that qwenc reads besides the weights (qwenc.loader._hf_parts).
MODEL_DIR_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                   "chat_template.jinja")
INDEX = "model.safetensors.index.json"

_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_SPEC = re.compile(rf"^(?P<repo>{_NAME}/{_NAME})(?P<file>/[^:@]+\.gguf)?(?P<tail>(?:[:@][^:@]+)*)$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_SPLIT_SUFFIX = re.compile(r"-(\d{5})-of-(\d{5})$")
_QUANT_LABEL = re.compile(r"^(?:I?Q\d+(?:_[A-Z0-9]+)*|TQ\d_\d|BF16|F16|F32|FP16|FP32|MXFP4(?:_MOE)?)$")


# ---------------------------------------------------------------- names

@dataclass(frozen=True)
class HubRef:
    repo_id: str
    filename: str = None     # a .gguf file in the repo
    quant: str = None        # a quantization label, e.g. Q4_K_M
    revision: str = None     # branch, tag or commit; None is the default branch

    def __str__(self):
        s = self.repo_id + (f"/{self.filename}" if self.filename else "")
        s += f":{self.quant}" if self.quant else ""
        return s + (f"@{self.revision}" if self.revision else "")


def parse_hub_ref(spec: str):
    """The HubRef that `spec` names, or None when it does not have the shape of a hub id.

    `OWNER/REPO`, `OWNER/REPO:QUANT`, `OWNER/REPO/FILE.gguf` (FILE may contain folders), each
    with an optional `@REV` (before or after `:QUANT`)."""
    m = _SPEC.match(str(spec))
    if m is None:
        return None
    quant = revision = None
    for part in re.findall(r"[:@][^:@]+", m["tail"]):
        if part[0] == ":":
            if quant is not None:
                return None
            quant = part[1:]
        else:
            if revision is not None:
                return None
            revision = part[1:]
    filename = m["file"][1:] if m["file"] else None
    if filename and quant:
        raise ModelNotFound(f"'{spec}': name a file or a quantization, not both")
    return HubRef(m["repo"], filename, quant, revision)


def quant_label(filename: str):
    """The quantization a GGUF file name states ('...-Q4_K_M.gguf', '....q8_0-00001-of-00002.gguf',
    'Q4_K_M/x.gguf'), upper-cased; None when it states none."""
    folder, _, base = filename.rpartition("/")
    stem = _SPLIT_SUFFIX.sub("", base[:-len(".gguf")] if base.endswith(".gguf") else base)
    for token in reversed(re.split(r"[-.]", stem) + ([folder.rpartition("/")[2]] if folder else [])):
        if _QUANT_LABEL.match(token.upper()):
            return token.upper()
    return None


# ---------------------------------------------------------------- settings

@dataclass(frozen=True)
class Settings:
    endpoint: str      # None: huggingface_hub's default (https://huggingface.co)
    cache_dir: Path
    token: str
    offline: bool

    @property
    def endpoint_name(self):
        return self.endpoint or DEFAULT_ENDPOINT


def _true(value) -> bool:
    return str(value or "").strip().upper() in ("1", "ON", "YES", "TRUE")


def hub_cache_dir() -> Path:
    """The HuggingFace hub cache, as huggingface_hub defines it: $HF_HUB_CACHE, else
    $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub."""
    def expand(p):
        return os.path.expandvars(os.path.expanduser(p))
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if cache:
        return Path(expand(cache))
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    return Path(expand(home)) / "hub"


def settings() -> Settings:
    endpoint = (os.environ.get("HF_ENDPOINT") or "").rstrip("/") or None
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN") or None
    offline = _true(os.environ.get("HF_HUB_OFFLINE")) or _true(os.environ.get("TRANSFORMERS_OFFLINE"))
    return Settings(endpoint, hub_cache_dir(), token, offline)


def repo_cache(cache_dir: Path, repo_id: str) -> Path:
    return Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))


# ---------------------------------------------------------------- which files

@dataclass(frozen=True)
class GGUFGroup:
    """One GGUF model in a repo: a single file, or all parts of a split one."""
    files: tuple        # in part order
    quant: str          # label from the name, or None

    @property
    def entry(self):
        return self.files[0]


def gguf_groups(names):
    """The GGUF models among repo file names, sorted by name. Vision projectors (mmproj-*) are
    not models and are left out; a split model missing parts is reported, not offered."""
    singles, splits = [], {}
    for name in names:
        base = name.rpartition("/")[2]
        if not name.endswith(".gguf") or base.lower().startswith("mmproj"):
            continue
        m = _SPLIT_SUFFIX.search(name[:-len(".gguf")])
        if m:
            splits.setdefault((name[:m.start()], int(m[2])), {})[int(m[1])] = name
        else:
            singles.append(GGUFGroup((name,), quant_label(name)))
    groups = list(singles)
    for (prefix, count), parts in splits.items():
        missing = [i for i in range(1, count + 1) if i not in parts]
        if missing:
            raise ModelFormatError(f"{prefix}-*-of-{count:05d}.gguf: split GGUF with part(s) "
                                   f"{', '.join(map(str, missing))} of {count} missing from the repo")
        files = tuple(parts[i] for i in range(1, count + 1))
        groups.append(GGUFGroup(files, quant_label(files[0])))
    return sorted(groups, key=lambda g: g.entry)


def _describe(groups):
    return ", ".join(f"{g.quant or '?'} ({g.entry}{f' + {len(g.files) - 1} parts' if len(g.files) > 1 else ''})"
                     for g in groups)


def choose_gguf(ref: HubRef, names) -> GGUFGroup:
    """The GGUF model `ref` asks for among the repo's file names."""
    groups = gguf_groups(names)
    if ref.filename:
        for g in groups:
            if ref.filename in g.files:
                return g
        raise ModelNotFound(f"{ref.repo_id} has no file {ref.filename}"
                            + (f"; its GGUF files: {_describe(groups)}" if groups else " and no GGUF files"))
    if not groups:
        raise ModelNotFound(f"{ref.repo_id} holds no GGUF files" + (f" (asked for {ref.quant})" if ref.quant else ""))
    if ref.quant:
        found = [g for g in groups if g.quant == ref.quant.upper()]
        if not found:
            raise ModelNotFound(f"{ref.repo_id} has no {ref.quant} GGUF; available: {_describe(groups)}. "
                                f"Name one as {ref.repo_id}:QUANT")
    elif len(groups) == 1:
        return groups[0]
    else:
        found = [g for g in groups if g.quant == DEFAULT_QUANT]
        if not found:
            raise ModelNotFound(f"{ref.repo_id} holds several GGUF quantizations and no {DEFAULT_QUANT}: "
                                f"{_describe(groups)}. Choose one with {ref.repo_id}:QUANT")
    if len(found) > 1:
        raise ModelNotFound(f"{ref.repo_id}: several GGUF files are {found[0].quant}: {_describe(found)}. "
                            f"Name one with {ref.repo_id}/FILE.gguf")
    return found[0]


def is_model_dir(names) -> bool:
    top = {n for n in names if "/" not in n}
    return "config.json" in top and any(n.endswith(".safetensors") for n in top)


def model_dir_files(names):
    """(the small files of a model directory, its weights or None when the index names them)."""
    top = {n for n in names if "/" not in n}
    small = [n for n in MODEL_DIR_FILES if n in top]
    small += sorted(n for n in names if n.startswith("additional_chat_templates/") and n.endswith(".jinja")
                    and n.count("/") == 1)
    if INDEX in top:
        return small + [INDEX], None
    if "model.safetensors" in top:
        return small, ["model.safetensors"]
    return small, sorted(n for n in top if n.endswith(".safetensors"))


def indexed_shards(index_path: Path, names):
    try:
        weight_map = json.loads(Path(index_path).read_text()).get("weight_map")
    except (OSError, ValueError, AttributeError) as exc:
        raise ModelFormatError(f"{index_path}: unreadable shard index ({exc})") from None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelFormatError(f"{index_path}: the shard index has no weight_map")
    shards = sorted(set(map(str, weight_map.values())))
    absent = [s for s in shards if s not in names]
    if absent:
        raise ModelFormatError(f"{index_path}: names shards the repo does not hold: {', '.join(absent)}")
    return shards


# ---------------------------------------------------------------- huggingface_hub

class _Unreachable(Exception):
    """The hub could not be asked (network, a server error, offline mode inside huggingface_hub)."""


def _hub():
    try:
        import huggingface_hub
    except ImportError:  # a core dependency; only a broken install lacks it
        raise ModelNotFound("hub ids need the huggingface_hub package: pip install huggingface_hub") from None
    return huggingface_hub


def _is_transport_error(exc) -> bool:
    # huggingface_hub's HTTP stack has changed (requests, httpx, httpx2): recognise its
    # connection and timeout errors by where they come from rather than by one library's classes.
    root = type(exc).__module__.split(".")[0]
    return isinstance(exc, (ConnectionError, TimeoutError)) or root in ("httpx", "httpx2", "httpcore", "requests",
                                                                        "urllib3")


def _hub_error(exc, ref: HubRef, s: Settings):
    """A qwenc exception for what huggingface_hub raised, or _Unreachable."""
    from huggingface_hub import errors as e
    if isinstance(exc, e.HFValidationError):
        return ModelNotFound(f"'{ref}' is not a local path, nor a valid hub id: {exc}")
    if isinstance(exc, e.GatedRepoError):
        return ModelNotFound(f"{ref.repo_id} on {s.endpoint_name} is gated: accept its terms on the model page, "
                             "then set HF_TOKEN to a token of that account")
    if isinstance(exc, e.RepositoryNotFoundError):
        token = "the token in HF_TOKEN has no access to it" if s.token else "if it is private, set HF_TOKEN"
        return ModelNotFound(f"'{ref}' is not a local path, and {s.endpoint_name} has no repo {ref.repo_id} "
                             f"({token})")
    if isinstance(exc, e.RevisionNotFoundError):
        return ModelNotFound(f"{ref.repo_id} on {s.endpoint_name} has no revision {ref.revision!r}")
    if isinstance(exc, e.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status in (401, 403):
            return ModelNotFound(f"{ref.repo_id} on {s.endpoint_name}: access refused ({status}); "
                                 "set HF_TOKEN to a token with access")
        if status is None or status >= 500 or status in (408, 429):
            return _Unreachable(f"{s.endpoint_name} answered {status}")
        return ModelNotFound(f"{ref}: {s.endpoint_name} answered {status}: {str(exc).splitlines()[0]}")
    if isinstance(exc, e.OfflineModeIsEnabled) or _is_transport_error(exc):
        return _Unreachable(f"{type(exc).__name__}: {exc}")
    return None


def _call(fn, ref, s, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001  (translated below; anything else is re-raised)
        mapped = _hub_error(exc, ref, s)
        if mapped is None:
            raise
        raise mapped from exc


def _remote_listing(hf, ref: HubRef, s: Settings):
    api = hf.HfApi(endpoint=s.endpoint, token=s.token)
    try:
        info = _call(api.model_info, ref, s, ref.repo_id, revision=ref.revision)
    except (ValueError, KeyError, TypeError) as exc:  # an answer that is not the hub's JSON
        raise ModelNotFound(f"'{ref}': {s.endpoint_name} did not answer as a HuggingFace hub does "
                            f"({type(exc).__name__}: {exc}); check HF_ENDPOINT") from exc
    if not info.sha:
        raise ModelNotFound(f"'{ref}': {s.endpoint_name} named no commit for {ref.repo_id}; check HF_ENDPOINT")
    return info.sha, [sib.rfilename for sib in (info.siblings or [])]


def _cached_listing(hf, ref: HubRef, s: Settings):
    """(commit, file names) of the cached snapshot `ref` leads to, or (None, None)."""
    repo = repo_cache(s.cache_dir, ref.repo_id)
    rev = ref.revision or DEFAULT_REVISION
    commit = None
    if _COMMIT.match(rev):
        commit = rev
    elif (repo / "refs" / rev).is_file():
        commit = (repo / "refs" / rev).read_text().strip()
    elif ref.revision is None and (repo / "snapshots").is_dir():
        # A snapshot without a ref (copied in by hand, or an older tool): the newest one.
        found = sorted((p for p in (repo / "snapshots").iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
        commit = found[-1].name if found else None
    snap = repo / "snapshots" / str(commit)
    if commit is None or not snap.is_dir():
        return None, None
    # huggingface_hub keeps the repo's file list per commit once it has downloaded from it: with
    # it, files missing from an interrupted download are known to be missing.
    cached_tree = getattr(hf, "get_cached_repo_tree", None)
    if cached_tree is not None:
        try:
            return commit, [f.path for f in cached_tree(ref.repo_id, revision=commit, cache_dir=str(s.cache_dir))]
        except Exception:  # noqa: BLE001  (no listing cached: fall back to the snapshot's files)
            pass
    names = [p.relative_to(snap).as_posix() for p in snap.rglob("*") if p.is_file()]
    return commit, names


def _say(msg):
    print(f"qwenc: {msg}", file=sys.stderr, flush=True)


class _Fetcher:
    """Makes files of one snapshot local: downloads them (online) or checks they are cached."""

    def __init__(self, hf, ref, s, commit, online, why_offline=None):
        self.hf, self.ref, self.s, self.commit, self.online, self.why = hf, ref, s, commit, online, why_offline
        self.snapshot = repo_cache(s.cache_dir, ref.repo_id) / "snapshots" / commit

    def __call__(self, files) -> Path:
        missing = [f for f in files if not (self.snapshot / f).is_file()]
        if not missing:
            return self.snapshot
        if not self.online:
            raise ModelNotFound(
                f"'{self.ref}': the cached snapshot {self.commit} in {self.s.cache_dir} lacks "
                f"{', '.join(missing)}, and {self.why}. Get it with `qwenc pull {self.ref}`"
                + (" (unset HF_HUB_OFFLINE first)" if self.s.offline else ""))
        _say(f"fetching {self.ref.repo_id}: {', '.join(missing)} from {self.s.endpoint_name}")
        # The revision as asked (not the commit), so that huggingface_hub records the branch's ref
        # for later offline use.
        revision = self.commit if _COMMIT.match(self.ref.revision or "") else (self.ref.revision or DEFAULT_REVISION)
        try:
            path = _call(self.hf.snapshot_download, self.ref, self.s, self.ref.repo_id, revision=revision,
                         allow_patterns=[glob.escape(f) for f in files], cache_dir=str(self.s.cache_dir),
                         endpoint=self.s.endpoint, token=self.s.token)
        except ModelNotFound:
            raise
        except (_Unreachable, OSError) as exc:
            raise ModelNotFound(f"'{self.ref}': downloading {', '.join(missing)} from {self.s.endpoint_name} "
                                f"failed ({exc}); run it again to retry") from exc
        # The branch may have moved since it was listed: the snapshot is the one downloaded to.
        self.snapshot = Path(path)
        still = [f for f in files if not (self.snapshot / f).is_file()]
        if still:
            raise ModelNotFound(f"'{self.ref}': download finished without {', '.join(still)}")
        return self.snapshot


def resolve_hub(ref: HubRef) -> Path:
    """The local path of what `ref` names: a model directory (a snapshot) or a GGUF file (for a
    split model, its first part). Downloads what is missing unless offline. Raises ModelNotFound."""
    hf = _hub()
    s = settings()
    commit = names = None
    why = "HF_HUB_OFFLINE is set" if s.offline else None
    online = not s.offline
    if online and _COMMIT.match(ref.revision or ""):
        commit, names = _cached_listing(hf, ref, s)  # a commit never changes: the cache answers
        if names is not None:
            try:
                return _pick(ref, names, _Fetcher(hf, ref, s, commit, online=False, why_offline="-"))
            except ModelNotFound:
                commit = names = None  # something is missing: ask the hub below
    if online:
        try:
            commit, names = _remote_listing(hf, ref, s)
        except _Unreachable as exc:
            online, why = False, f"the hub at {s.endpoint_name} could not be reached ({exc})"
    if not online:
        commit, names = _cached_listing(hf, ref, s)
        if commit is None:
            how = ("unset HF_HUB_OFFLINE, or fetch it with `qwenc pull {0}` where the hub can be reached "
                   "(with the same HF_HOME)" if s.offline else
                   "check the network (or HF_ENDPOINT), then fetch it with `qwenc pull {0}`").format(ref)
            raise ModelNotFound(f"'{ref}' is not a local path and is not in the HuggingFace cache "
                                f"({s.cache_dir}), and {why}: {how}")
        if not s.offline:
            _say(f"{why}; using the cached {ref.repo_id} at {commit}")
    return _pick(ref, names, _Fetcher(hf, ref, s, commit, online, why))


def _pick(ref: HubRef, names, fetch: _Fetcher) -> Path:
    if not ref.filename and not ref.quant and is_model_dir(names):
        small, weights = model_dir_files(names)
        if weights is not None:
            return fetch(small + weights)
        # Sharded: the index names the shards, so it comes first.
        snap = fetch(small)
        return fetch(indexed_shards(snap / INDEX, names))
    if not ref.filename and not ref.quant and not any(n.endswith(".gguf") for n in names):
        shown = ", ".join(sorted(n for n in names if not n.startswith("."))[:12]) or "no files"
        if not fetch.online:  # what is cached may be what an interrupted download left
            raise ModelNotFound(f"'{ref}': the cached snapshot {fetch.commit} holds no model qwenc can load "
                                f"({shown}), and {fetch.why}. Get it with `qwenc pull {ref}`")
        raise ModelFormatError(f"{ref.repo_id} holds neither safetensors weights with a config.json nor GGUF "
                               f"files, the formats qwenc reads (it holds: {shown})")
    group = choose_gguf(ref, names)
    return fetch(list(group.files)) / group.entry
