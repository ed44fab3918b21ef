"""`h3bridge model download`: the official MiniMax-H3 checkpoint from the Hugging Face hub, on
`huggingface_hub`.

What upstream says about the files (h3.c 8974cc0 and its pull requests, see inventory.py):
  - the repository is `MiniMaxAI/MiniMax-H3` (antirez/h3.c PR 22 and PR 43 README:
    `hf download MiniMaxAI/MiniMax-H3 --local-dir ./MiniMax-H3 --include "FL2VA/*"`);
  - h3 reads the `FL2VA/` tree for every job and `Ref2VA/` for reference jobs (h3.c h3_load_dir,
    h3_generate); Ref2VA is "that optional 62 GiB checkpoint" (h3.c h3_load_dir's comment), i.e.
    its own transformer: the other Ref2VA components are published identical to FL2VA's.
    Which files are identical is not assumed here: it is read from the hub's own SHA-256 (the LFS
    oid) of each file at the revision, and an identical file is downloaded and stored once (one
    inode, hard-linked into both partitions; a copy where the disk cannot link).

Pinned revision: `main`. No commit hash of MiniMaxAI/MiniMax-H3 appears in upstream's source,
README or pull requests (they all download the default branch), and the hub cannot be reached
from where h3bridge is developed, so the pin is the name upstream documents. What pins the files
is the commit `main` resolves to at the first run: it is recorded in DIR/.cache/h3bridge/download.json
and every rerun continues that same commit, so a moved `main` never mixes two snapshots.

Resuming: each file is fetched through safeio/http.py (httpx; connect and read timeouts, a stall
bound, a deadline, never a byte past the listed size; a Range request from what is kept, again at
once after a dropped connection that delivered bytes) into DIR/.cache/h3bridge/download/<hash>.part,
which survives Ctrl-C and is continued from its size by the next run; a finished file is hashed
(SHA-256 against the hub's LFS oid; the git blob id for small files), its safetensors header
checked (what h3 cannot load: misaligned data, quantized tensors), then linked into place atomically. A file at a destination
that h3bridge did not put there and that differs from the hub's is never replaced.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from ..runnable import command
from ..fixes import Blank, Fix, changes, literal
from ..errors import DiskError, H3BridgeError, IntegrityError, ModelError, shown_value
from ..safeio.outputs import rename_new
from ..safeio.paths import open_regular, symlink_note
from ..safeio.http import (FetchConnectionError, FetchError, FetchLimits, FetchTimeout, FetchTooLong,
                           call_with_deadline, fetch_to_file)
from .inventory import (
    FL2VA,
    OFFICIAL_REPO,
    PARTITIONS,
    QUANTIZED_NAME,
    REF2VA,
    REF2VA_MARKER,
    REQUIRED_FILES,
    Component,
    format_bytes,
    inspect_model,
)
from .problem import Problem
from .safetensors import read_header

_HEX = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
PINNED_REVISION = "main"         # see the module doc: no commit hash is published upstream
ALL = "all"
PARTITION_CHOICES = (FL2VA, REF2VA, ALL)
# The official checkpoint, as the fix that names it (h3bridge.fixes): `--repo ...` / `repo_id=...`.
_OFFICIAL = (changes(repo_id=OFFICIAL_REPO),)
RECORD = Path(".cache") / "h3bridge" / "download.json"
PARTS = Path(".cache") / "h3bridge" / "download"
# What upstream measured (README's sizes table), and what the released shapes add up to (h3-sim-model
# --realistic): each partition is ~134 GiB (DiT 61.7 GiB, text encoder 62.1 GiB, VAEs 10.3 GiB), and
# Ref2VA's files other than its own DiT are FL2VA's, stored once. So `--partition FL2VA` downloads
# ~134 GiB, `all` ~196 GiB, and Ref2VA after FL2VA the other ~62 GiB. The exact figure is printed
# before a download starts.
FL2VA_DOWNLOAD_GIB = 134
REF2VA_OWN_GIB = 62
ALL_DOWNLOAD_GIB = FL2VA_DOWNLOAD_GIB + REF2VA_OWN_GIB
def partition_size_note(directory: str | Path) -> str:
    """How much each partition downloads into `directory`, with the command for the smaller one."""
    return (f"about {ALL_DOWNLOAD_GIB} GiB with all, the default ({FL2VA}'s ~{FL2VA_DOWNLOAD_GIB} GiB and "
            f"{REF2VA}'s own ~{REF2VA_OWN_GIB} GiB transformer for reference jobs; {REF2VA}'s other files "
            f"are {FL2VA}'s, stored once); about {FL2VA_DOWNLOAD_GIB} GiB with "
            f"`{download_command(directory, FL2VA)}`, which serves every job without references")
# The bounds of talking to the hub (safeio/http.py): the listing must come within LISTING_DEADLINE;
# each file must keep coming at FetchLimits' stall rate (256 KiB a minute) or it is stopped, and
# must finish within FILE_DEADLINE_BASE plus what that rate needs for its size. A file the hub lists
# as larger than MAX_LISTED_SIZE is refused (the largest shard of the release is ~5 GiB).
LISTING_DEADLINE = 300.0
FILE_DEADLINE_BASE = 600.0
MAX_LISTED_SIZE = 1 << 40
# Attempts of one file that bring no new byte before the failure is reported (a dropped connection
# that delivered bytes is always picked up again, within the file's deadline).
NO_PROGRESS_ATTEMPTS = 3
# h3 recognises a model by these (h3.c h3_load_dir): they are placed last, so an unfinished
# download never looks like a model h3 would load.
_MARKERS = tuple(f"{FL2VA}/{name}" for name in REQUIRED_FILES) + (f"{REF2VA}/{REF2VA_MARKER}",)


def download_command(directory: str | Path, partition: str = ALL) -> str:
    """The exact command that downloads the model into `directory` (for messages and nodes)."""
    from ..runnable import h3bridge_command      # runnable where the message is shown (issue 30)
    return h3bridge_command("model", "download", str(directory), *(() if partition == ALL else ("--partition", partition)))


@dataclass(frozen=True)
class HubFile:
    path: str                # relative to the repository root, e.g. FL2VA/transformer/config.json
    size: int
    sha256: str | None       # the LFS oid (large files)
    blob_id: str | None      # the git blob id (small files, not in LFS)

    @property
    def key(self) -> str:
        """What identical files share: the content hash the hub publishes."""
        return self.sha256 or f"git-{self.blob_id}"


@dataclass
class DownloadPlan:
    repo_id: str
    revision: str
    commit: str
    directory: Path
    files: list[HubFile]
    done: set[str] = field(default_factory=set)                 # paths already in place and verified
    replaceable: set[str] = field(default_factory=set)          # h3bridge's own files of another commit
    links: bool = True                                          # the disk can hard-link
    partition: str = ALL                                        # as asked (--partition), for messages

    @property
    def groups(self) -> dict[str, list[HubFile]]:
        """Files still to place, by content: identical files are fetched once. Markers last."""
        grouped: dict[str, list[HubFile]] = defaultdict(list)
        for item in sorted(self.files, key=lambda f: (f.path in _MARKERS, f.path)):
            if item.path not in self.done:
                grouped[item.key].append(item)
        return dict(grouped)

    def part_path(self, key: str) -> Path:
        return self.directory / PARTS / f"{key}.part"

    def kept_bytes(self, key: str) -> int:
        try:
            return self.part_path(key).stat().st_size
        except OSError:
            return 0

    @property
    def in_place(self) -> dict[str, Path]:
        """Contents already here (a verified file at one of their destinations): the files still
        missing with the same content are linked to it, not downloaded (FL2VA first, Ref2VA later)."""
        return {f.key: self.directory / f.path for f in self.files if f.path in self.done}

    @property
    def remaining_bytes(self) -> int:
        """Disk the rest of the download takes: each missing content once, less what a previous
        run left in its .part; one more copy per extra destination where links do not work."""
        total = 0
        here = self.in_place
        for key, items in self.groups.items():
            if key not in here:
                total += max(items[0].size - self.kept_bytes(key), 0)
            if not self.links:
                total += items[0].size * (len(items) - (0 if key in here else 1))
        return total

    @property
    def shared(self) -> list[HubFile]:
        """Ref2VA files identical (by the hub's hash) to an FL2VA file."""
        fl2va = {f.key for f in self.files if f.path.startswith(FL2VA + "/")}
        return [f for f in self.files if f.path.startswith(REF2VA + "/") and f.key in fl2va]

    def summary(self) -> str:
        by_partition = {name: sum(f.size for f in self.files if f.path.startswith(name + "/")) for name in PARTITIONS}
        parts = ", ".join(f"{name} {format_bytes(size)}" for name, size in by_partition.items() if size)
        shared = self.shared
        stored = sum(f.size for f in {f.key: f for f in self.files}.values())
        line = (f"{self.repo_id} at {self.revision} (commit {self.commit[:12]}): {len(self.files)} files, {parts}; "
                f"{format_bytes(stored)} on disk")
        if shared:
            line += (f" ({len(shared)} Ref2VA files, {format_bytes(sum(f.size for f in shared))}, are identical to "
                     f"FL2VA's by the hub's SHA-256 and are stored once)")
        return line + f"; still to download: {format_bytes(self.remaining_bytes)}"


# ---------------------------------------------------------------------------------------------
# The record of what h3bridge placed (so its own files of an older commit may be replaced)


RECORD_LIMIT = 4 << 20      # the record of a ~200-file checkpoint is ~40 KB; a larger one is not ours


def _refuse_record(path: Path, kind: str) -> ModelError:
    return ModelError(f"{path} is {kind}{symlink_note(path)}, not h3bridge's download record (a regular JSON file); "
                      "h3bridge does not read or replace it",
                      hint=f"remove it (`rm {path}`), then run the same command again: the download continues "
                           "from the files in place")


def _read_record(directory: Path) -> dict[str, object]:
    """What h3bridge recorded in DIR (its record, read through the path reader with a size cap): a
    FIFO or a device there is refused (ModelError); a record that is unreadable, too large, not JSON
    or not the shape h3bridge writes counts as no record (the files in place are then checked
    against the hub as if h3bridge had not put them there)."""
    path = directory / RECORD
    try:
        with open_regular(path, _refuse_record) as handle:
            data = handle.read(RECORD_LIMIT + 1)
    except FileNotFoundError:
        return {}
    except OSError:
        return {}
    if len(data) > RECORD_LIMIT:
        return {}
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return {}
    return value if _record_shape_ok(value) else {}


def _record_shape_ok(value: object) -> bool:
    """The record's shape as _write_record writes it: strings, and `placed` mapping paths to hashes."""
    if not isinstance(value, dict):
        return False
    if any(key in value and not isinstance(value[key], str) for key in ("repo_id", "revision", "commit")):
        return False
    placed = value.get("placed", {})
    return isinstance(placed, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in placed.items())


def _write_record(directory: Path, record: dict[str, object]) -> None:
    from .verify import _atomic_write_json   # the one atomic JSON writer
    try:
        _atomic_write_json(directory / RECORD, record)
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise DiskError(f"the disk is full: h3bridge cannot write its download record {directory / RECORD}",
                        folder=directory, free=free_bytes(directory),
                        hint="free some space on that disk, then run the same command again: it continues where "
                             "it stopped") from None


# ---------------------------------------------------------------------------------------------
# Planning: what the hub has, what is here, whether it fits


def _hub_error(error: Exception, repo_id: str, revision: str, endpoint: str) -> H3BridgeError:
    from huggingface_hub.errors import (GatedRepoError, OfflineModeIsEnabled, RepositoryNotFoundError,
                                        RevisionNotFoundError)
    if isinstance(error, OfflineModeIsEnabled):
        return ModelError("huggingface_hub is in offline mode (HF_HUB_OFFLINE is set), so nothing can be downloaded",
                          hint="unset HF_HUB_OFFLINE (`unset HF_HUB_OFFLINE`), then run the same command again")
    if isinstance(error, RevisionNotFoundError):
        return ModelError(f"revision {revision!r} does not exist in {repo_id}",
                          hint=Fix("pass {} with a branch, tag or commit of " + literal(repo_id) + ", or leave it out "
                                   + literal(f"(the pinned revision is {PINNED_REVISION!r})"),
                                   (changes(revision=Blank("REV")),)))
    if isinstance(error, GatedRepoError):
        return ModelError(f"{repo_id} needs you to accept its licence before downloading",
                          hint=f"accept it on {endpoint}/{repo_id}, then log in with `{command('hf', 'auth', 'login')}` and run the "
                               "same command again")
    if isinstance(error, RepositoryNotFoundError):
        return ModelError(f"repository {repo_id} not found on {endpoint}",
                          hint=Fix("pass {} (the official checkpoint), or log in with "
                                   + literal(f"`{command('hf', 'auth', 'login')}`") + " if it is private", _OFFICIAL))
    return ModelError(f"cannot reach {endpoint}: {error}",
                      hint="check the network (and HF_ENDPOINT if you set it), then run the same command again: "
                           "it continues where it stopped")


def _list_hub_files(repo_id: str, revision: str, endpoint: str,
                    limits: FetchLimits | None = None) -> tuple[str, list[HubFile]]:
    from huggingface_hub import HfApi
    limits = limits or default_limits()
    try:
        # huggingface_hub's call takes a timeout (connect, and each read) but no deadline: a hub
        # dripping its answer is bounded by call_with_deadline
        info = call_with_deadline(
            lambda: HfApi(endpoint=endpoint).model_info(repo_id, revision=revision, files_metadata=True,
                                                        timeout=max(limits.connect_timeout, limits.read_timeout)),
            LISTING_DEADLINE if limits.deadline is None else limits.deadline, f"{endpoint} (listing {repo_id})")
    except FetchTimeout as error:
        raise ModelError(f"{error.message}: the hub did not list {repo_id}'s files in time",
                         hint="check the network (and HF_ENDPOINT if you set it), then run the same command again: "
                              "it continues where it stopped") from None
    except Exception as error:       # every hub/network failure is turned into a message with a fix
        raise _hub_error(error, repo_id, revision, endpoint) from None
    try:
        files = [HubFile(path=s.rfilename, size=_listed_size(s.lfs.size if s.lfs else (s.size or 0)),
                         sha256=s.lfs.sha256 if s.lfs else None, blob_id=s.blob_id)
                 for s in (info.siblings or [])]
    except (TypeError, ValueError, AttributeError) as error:
        raise ModelError(f"{endpoint} lists {repo_id}'s files with a size h3bridge cannot use ({error})",
                         hint="check HF_ENDPOINT: it must point to a Hugging Face hub or a faithful mirror") from None
    if not info.sha:
        raise ModelError(f"{endpoint} gave no commit for {repo_id} at {revision!r}",
                         hint="check HF_ENDPOINT: it must point to a Hugging Face hub")
    for item in files:
        # names and hashes become paths here: nothing may point outside DIR
        parts = item.path.split("/")
        if item.path.startswith("/") or any(part in ("", ".", "..") for part in parts) or "\\" in item.path \
                or not _HEX.fullmatch(item.key.removeprefix("git-")):
            raise ModelError(f"{endpoint} lists a file h3bridge will not write: {item.path!r} (hash {item.key!r})",
                             hint="check HF_ENDPOINT: it must point to a Hugging Face hub or a faithful mirror")
    folders = {"/".join(f.path.split("/")[:depth]) for f in files for depth in range(1, f.path.count("/") + 1)}
    clash = sorted(f.path for f in files if f.path in folders)
    if clash:
        raise ModelError(f"{endpoint} lists {clash[0]!r} both as a file and as a folder of other files; h3bridge "
                         "cannot place both", hint="check HF_ENDPOINT: it must point to a Hugging Face hub or a "
                                                   "faithful mirror")
    return info.sha, files


def _listed_size(value: object) -> int:
    """A file size as the hub lists it: a whole number from 0 to MAX_LISTED_SIZE."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LISTED_SIZE:
        raise ValueError(f"{shown_value(value)} is not a size from 0 to {format_bytes(MAX_LISTED_SIZE)}")
    return value


def _refuse_repack(repo_id: str, files: list[HubFile]) -> None:
    """What h3 cannot load, told from the file list before anything is downloaded."""
    names = [f.path for f in files]
    if f"{FL2VA}/{REQUIRED_FILES[0]}" not in names:
        singles = [n for n in names if n.endswith((".safetensors", ".gguf"))]
        quantized = [n for n in singles if QUANTIZED_NAME.search(n)]
        what = (f"single-file weights such as {singles[0]} (a ComfyUI-style repack"
                + (f", quantized: {quantized[0]}" if quantized else "") + ")") if singles else "no FL2VA/ tree"
        raise ModelError(f"{repo_id} is not the official MiniMax-H3 layout h3 reads (FL2VA/ and Ref2VA/ sharded "
                         f"BF16/F32 safetensors): it has {what}; h3 cannot load it",
                         hint=Fix("pass {} (or leave it out)", _OFFICIAL))
    quantized = [n for n in names if n.endswith(".safetensors") and QUANTIZED_NAME.search(n.rsplit("/", 1)[-1])]
    if quantized:
        raise ModelError(f"{repo_id} holds quantized weights ({quantized[0]}); h3 loads BF16/F32 weights only",
                         hint=Fix("pass {} (or leave it out)", _OFFICIAL))


def _hash_of(path: Path, item: HubFile) -> str:
    """The hash the hub publishes for `item`, computed over `path`: SHA-256 for LFS files, the
    git blob id (sha1 of 'blob <size>\\0' + content) for small ones."""
    from .verify import sha256_file
    if item.sha256:
        return sha256_file(path)
    try:
        with open_regular(path, _not_a_file) as handle:      # never a FIFO or a device
            digest = hashlib.sha1(f"blob {os.fstat(handle.fileno()).st_size}\0".encode())
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError as error:
        raise IntegrityError(f"{path}: cannot read: {error.strerror or error}", path=path,
                             hint="check the file and its disk, then run the same command again") from None
    return digest.hexdigest()


def _not_a_file(path: Path, kind: str) -> ModelError:
    return ModelError(f"{path} is in the way: it is {kind}{symlink_note(path)}, not a regular file",
                      hint=f"move it away (`mv {path} {path}.mine`), then run the same command again")


def _expected(item: HubFile) -> str:
    return item.sha256 or item.blob_id or ""


def _links_work(directory: Path) -> bool:
    probe = directory / PARTS
    probe.mkdir(parents=True, exist_ok=True)
    source = probe / f".link-probe-{os.getpid()}"
    target = probe / f".link-probe-{os.getpid()}.2"
    try:
        source.write_bytes(b"")
        os.link(source, target)
        return True
    except OSError:
        return False
    finally:
        for path in (source, target):
            path.unlink(missing_ok=True)


def _check_directory(directory: Path, partition: str) -> None:
    """Before anything is fetched: DIR must be new, empty, or a model folder (ours or a
    Hugging Face download) - never somebody's other files, never a repack."""
    if directory.exists() and not directory.is_dir():
        raise ModelError(f"{directory} is a file, not a folder",
                         hint="pass a new folder as DIR, e.g. ~/models/MiniMax-H3")
    if directory.is_dir():
        entries = [p.name for p in directory.iterdir() if p.name != ".cache"]
        if entries and not any(name in PARTITIONS for name in entries):
            inventory = inspect_model(directory, read_headers=False)
            reason = next((p.message for p in inventory.problems if p.kind in ("comfyui-repack", "gguf")),
                          f"it holds other files ({', '.join(sorted(entries)[:3])})")
            raise ModelError(f"{directory} is not a MiniMax-H3 folder: {reason}; h3bridge downloads only into a "
                             "new or empty folder, or one that already holds FL2VA/ or Ref2VA/",
                             hint=f"pass a new folder as DIR: `{download_command(directory.parent / 'MiniMax-H3', partition)}`")
    if partition == REF2VA and not (directory / FL2VA).is_dir():
        raise ModelError(Fix("{} alone cannot run: h3 needs FL2VA for every job (Ref2VA only adds reference jobs)",
                             (changes(partition=REF2VA),)),
                         hint=Fix("pass {} (Ref2VA shares most files with FL2VA): "
                                  + literal(f"`{download_command(directory)}`"), (changes(partition=ALL),)))


def default_limits() -> FetchLimits:
    """The bounds of a download: HF_HUB_DOWNLOAD_TIMEOUT (as `hf download` honours it) is the longest
    silence allowed, and the stall rule is judged over a window no shorter than that silence."""
    from huggingface_hub import constants
    read = float(constants.HF_HUB_DOWNLOAD_TIMEOUT)
    return FetchLimits(read_timeout=read, stall_window=max(FetchLimits.stall_window, read))


def plan_download(directory: str | Path, *, partition: str = ALL, revision: str | None = None,
                  repo_id: str = OFFICIAL_REPO, endpoint: str | None = None,
                  limits: FetchLimits | None = None) -> DownloadPlan:
    """Ask the hub what `partition` is at `revision`, and see what `directory` already holds.
    Raises (ModelError, IntegrityError) before anything is downloaded."""
    from huggingface_hub import constants
    if partition not in PARTITION_CHOICES:
        raise ModelError(f"unknown partition {partition!r}",
                         hint=Fix("pass {} with one of " + literal(", ".join(PARTITION_CHOICES)),
                                  (changes(partition=Blank("NAME")),)))
    directory = Path(directory).expanduser()
    endpoint = (endpoint or constants.ENDPOINT).rstrip("/")
    _check_directory(directory, partition)
    record = _read_record(directory)
    asked = revision or str(record.get("revision") or PINNED_REVISION)
    same = record.get("repo_id") == repo_id and record.get("revision") == asked and isinstance(record.get("commit"), str)
    commit, files = _list_hub_files(repo_id, str(record["commit"]) if same else asked, endpoint, limits)
    _refuse_repack(repo_id, files)
    wanted = PARTITIONS if partition == ALL else (partition,)
    files = [f for f in files if f.path.split("/", 1)[0] in wanted]
    plan = DownloadPlan(repo_id=repo_id, revision=asked, commit=commit, directory=directory, files=files,
                        partition=partition)
    placed = record.get("placed") if isinstance(record.get("placed"), dict) else {}
    _find_done(plan, placed)      # type: ignore[arg-type]
    directory.mkdir(parents=True, exist_ok=True)
    plan.links = _links_work(directory)
    _drop_leftovers(plan)
    return plan


def _drop_leftovers(plan: DownloadPlan) -> None:
    """What a stopped run of h3bridge's own leaves and no run continues from: a .part whose content
    is already in place everywhere it goes (a run stopped between placing a file and removing its
    .part, e.g. by a full disk), and the record writer's temporary (a run killed between writing
    and renaming it). Kept, each would count as an unfinished download at every rerun, while
    nothing is left to download."""
    pending = {plan.part_path(key) for key in plan.groups}
    finished = {plan.part_path(f.key) for f in plan.files if f.path in plan.done} - pending
    record_temporaries = set((plan.directory / RECORD.parent).glob(f".{RECORD.name}.*.tmp"))
    for leftover in finished | record_temporaries:
        if leftover.is_file() and not leftover.is_symlink():
            leftover.unlink()


def _find_done(plan: DownloadPlan, placed: dict[str, str]) -> None:
    """Files already at their destination with the hub's hash are done; h3bridge's own files of
    another commit may be replaced; anything else there is the user's and stops the download."""
    from .verify import FileIdentity, HashCache
    cache = HashCache().load()
    for item in plan.files:
        destination = plan.directory / item.path
        for folder in list(reversed(destination.relative_to(plan.directory).parents))[1:]:
            where = plan.directory / folder
            if where.exists() and not where.is_dir():
                raise ModelError(f"{where} is in the way: {item.path} goes inside a folder there, but it is not one",
                                 hint=f"move it away (`mv {where} {where}.mine`), then run the same command again")
        if not destination.exists() and not destination.is_symlink():
            continue
        if not destination.is_file():
            raise ModelError(f"{destination} is in the way: it is not a regular file",
                             hint=f"move it away (`mv {destination} {destination}.mine`), then run the same command again")
        identity = FileIdentity.of(destination)
        known = cache.get(identity) if item.sha256 else None
        found = known or _hash_of(destination, item)
        if item.sha256 and not known:
            cache.put(identity, found)
        if found == _expected(item):
            plan.done.add(item.path)
        elif placed.get(item.path) == found:
            plan.replaceable.add(item.path)     # ours, from another commit: the new one replaces it
        else:
            raise ModelError(f"{destination} already exists and differs from {plan.repo_id}'s file at commit "
                             f"{plan.commit[:12]}; h3bridge does not overwrite files it did not download",
                             hint=f"move it away (`mv {destination} {destination}.mine`), then run the same command again")
    cache.save()


def free_bytes(directory: Path) -> int:
    """Free space on the disk that holds `directory` (its nearest existing folder)."""
    for folder in (directory, *directory.parents):
        if folder.exists():
            return shutil.disk_usage(folder).free
    return shutil.disk_usage("/").free


def check_space(plan: DownloadPlan, free: int) -> None:
    """Refuse before fetching anything when the rest of the download does not fit in `free` bytes."""
    needed = plan.remaining_bytes
    if needed > free:
        smaller = ("" if len({f.path.split('/', 1)[0] for f in plan.files}) == 1 else
                   f", or fetch only FL2VA for now (`{download_command(plan.directory, FL2VA)}`)")
        raise DiskError(f"not enough free disk for the download into {plan.directory}: {format_bytes(needed)} still "
                        f"to download, {format_bytes(free)} free", folder=plan.directory, free=free, needed=needed,
                        before_start=True,
                        hint=f"free {format_bytes(needed - free)} on that disk, or pass a DIR on a bigger disk{smaller}")


# ---------------------------------------------------------------------------------------------
# Fetching


def _fetch(plan: DownloadPlan, key: str, item: HubFile, *, progress: bool, limits: FetchLimits) -> Path:
    """Bring one content to its .part file (continuing a previous run's) through safeio/http.py
    (timeouts, the stall rule, a deadline, never a byte past the listed size), and check it."""
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub.utils import build_hf_headers
    part = plan.part_path(key)
    part.parent.mkdir(parents=True, exist_ok=True)
    url = hf_hub_url(plan.repo_id, item.path, revision=plan.commit, endpoint=_endpoint())
    again = f"run the same command again (`{download_command(plan.directory, plan.partition)}`)"
    rate = limits.stall_bytes / limits.stall_window
    deadline_at = time.monotonic() + (limits.deadline if limits.deadline is not None
                                      else FILE_DEADLINE_BASE + (item.size / rate if rate else 0))
    fruitless = 0
    while True:
        before = plan.kept_bytes(key)
        try:
            with _progress_bar(item, before, progress) as bar:
                # written in huggingface_hub's own chunk size, as its http_get writes
                fetch_to_file(url, part, size=item.size, headers=build_hf_headers(), limits=limits,
                              deadline_at=deadline_at, write_chunk=int(constants.DOWNLOAD_CHUNK_SIZE),
                              on_bytes=bar)
            break
        except FetchTooLong as error:
            part.unlink(missing_ok=True)       # the bytes of a body that is not the listed file are not kept
            raise ModelError(f"the download of {item.path} was stopped: {error.message}; nothing of it was kept",
                             hint="check HF_ENDPOINT (and any proxy): it must serve the files the hub lists; then "
                                  f"{again}") from None
        except FetchError as error:
            failure: Exception = error
        except OSError as error:
            if error.errno in (errno.ENOSPC, errno.EDQUOT):
                raise _disk_full(plan, item, again) from None
            raise ModelError(f"cannot write the download of {item.path} into {part.parent}: "
                             f"{error.strerror or error}",
                             hint=f"check that folder and its disk, then {again}") from None
        # A connection that delivered bytes before it broke is picked up again at once (a Range
        # request from what is kept), within the file's deadline; a few that deliver nothing are
        # reported, as is a stall, a timeout or an HTTP error.
        fruitless = 0 if plan.kept_bytes(key) > before else fruitless + 1
        if not isinstance(failure, FetchConnectionError) or fruitless >= NO_PROGRESS_ATTEMPTS \
                or time.monotonic() >= deadline_at:
            raise ModelError(f"the download of {item.path} stopped: {failure}",
                             hint=f"check the network, then {again}: it continues from the "
                                  f"{format_bytes(plan.kept_bytes(key))} already downloaded") from None
    found = _hash_of(part, item)
    if found != _expected(item):
        part.unlink()
        kind = "sha256" if item.sha256 else "git blob id"
        raise IntegrityError(f"{item.path}: the downloaded file has {kind} {found}, but {plan.repo_id} publishes "
                             f"{_expected(item)} at commit {plan.commit[:12]}: it was damaged on the way and is "
                             "discarded (nothing was put in place)", path=plan.directory / item.path,
                             hint="run the same command again to download it again; if it fails the same way, a "
                                  "proxy or the mirror in HF_ENDPOINT is serving a different file")
    if item.path.endswith(".safetensors"):
        _refuse_unloadable(part, item, plan)
    return part


def _refuse_unloadable(part: Path, item: HubFile, plan: DownloadPlan) -> None:
    """The header checks `h3bridge info` makes (misaligned data, quantized tensors), on the file."""
    from .inventory import ComponentSpec, _check_quantized
    problems: list[Problem] = []
    try:
        header = read_header(part)
    except IntegrityError as error:
        part.unlink()
        raise IntegrityError(f"{item.path} from {plan.repo_id}: {error.message.split(': ', 1)[-1]}; h3 cannot load it",
                             path=plan.directory / item.path,
                             hint=Fix("pass {} (the official shards)", _OFFICIAL)) from None
    component = Component(partition=item.path.split("/", 1)[0], spec=ComponentSpec("file", item.path, item.path),
                          directory=plan.directory / item.path, shards=[header])
    _check_quantized(component, problems.append)
    if problems:
        part.unlink()
        raise ModelError(f"{item.path} from {plan.repo_id}: {problems[0].message}",
                         hint=Fix("pass {} (the BF16 release)", _OFFICIAL))


def _disk_full(plan: DownloadPlan, item: HubFile, again: str) -> DiskError:
    kept = plan.kept_bytes(item.key)
    return DiskError(f"the disk filled up while downloading {item.path} into {plan.directory}",
                     folder=plan.directory, free=free_bytes(plan.directory), needed=plan.remaining_bytes,
                     hint=f"free {format_bytes(plan.remaining_bytes)} on that disk, then {again}: it continues"
                          + (f" from the {format_bytes(kept)} kept" if kept else " where it stopped"))


@contextmanager
def _progress_bar(item: HubFile, initial: int, shown: bool) -> Iterator[Callable[[int], None]]:
    """A bytes/rate/ETA bar for one file (huggingface_hub's tqdm, which honours its
    HF_HUB_DISABLE_PROGRESS_BARS switch); `on_bytes` for fetch_to_file."""
    from huggingface_hub.utils import tqdm
    name = item.path if len(item.path) <= 40 else f"(…){item.path[-40:]}"
    with tqdm(total=item.size, initial=initial, unit="B", unit_scale=True, unit_divisor=1024, desc=name,
              disable=not shown) as bar:
        yield bar.update


def _endpoint() -> str:
    from huggingface_hub import constants
    return constants.ENDPOINT.rstrip("/")


def _place(plan: DownloadPlan, part: Path, items: list[HubFile], record: dict[str, object], *,
           downloaded: bool) -> None:
    """Put one verified content at each of its destinations: a hard link (one inode for files
    FL2VA and Ref2VA share), else a copy; each appears atomically and never replaces a file
    h3bridge did not put there."""
    try:
        _place_each(plan, part, items, record, downloaded=downloaded)
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _disk_full(plan, items[0], f"run the same command again "
                                             f"(`{download_command(plan.directory, plan.partition)}`)") from None
        raise


def _place_each(plan: DownloadPlan, part: Path, items: list[HubFile], record: dict[str, object], *,
                downloaded: bool) -> None:
    from huggingface_hub._local_folder import write_download_metadata   # the format `hf download --local-dir` reads
    from .verify import FileIdentity, HashCache
    cache = HashCache().load()
    placed = record.setdefault("placed", {})
    for item in items:
        destination = plan.directory / item.path
        destination.parent.mkdir(parents=True, exist_ok=True)
        temporary = destination.with_name(f".{destination.name}.{os.getpid()}.h3bridge-tmp")
        temporary.unlink(missing_ok=True)
        if plan.links:
            os.link(part, temporary)
        else:
            shutil.copyfile(part, temporary)
        try:
            if item.path in plan.replaceable:
                os.replace(temporary, destination)
            else:
                os.link(temporary, destination) if plan.links else _rename_new(temporary, destination)
        except FileExistsError:
            raise ModelError(f"{destination} appeared while downloading; h3bridge does not overwrite it",
                             hint=f"move it away (`mv {destination} {destination}.mine`), then run the same command "
                                  "again") from None
        finally:
            temporary.unlink(missing_ok=True)
        if item.sha256:
            cache.put(FileIdentity.of(destination), item.sha256)
            write_download_metadata(plan.directory, item.path, plan.commit, item.sha256)
        placed[item.path] = _expected(item)           # type: ignore[index]
        plan.done.add(item.path)
    _write_record(plan.directory, record)
    cache.save()
    if downloaded:
        part.unlink(missing_ok=True)     # the .part; its content now lives at the destinations


def _rename_new(source: Path, destination: Path) -> None:
    # safeio's rename that never replaces (renameat2/renamex_np): no window between a check and the
    # rename in which another program's file could appear and be overwritten
    if not rename_new(source, destination):
        raise FileExistsError(destination)


@dataclass
class DownloadResult:
    plan: DownloadPlan
    fetched: list[str]
    report: object          # verify.VerifyReport


def download_model(directory: str | Path, *, partition: str = ALL, revision: str | None = None,
                   repo_id: str = OFFICIAL_REPO, progress: bool = True,
                   free: Callable[[Path], int] = free_bytes, say: Callable[[str], None] | None = None,
                   limits: FetchLimits | None = None) -> DownloadResult:
    """Download (or continue downloading) `partition` of the checkpoint into `directory`, then
    verify it. `free` reports the free bytes of a folder's disk (replaceable in tests); `limits`
    bounds every wait on the hub (default: `default_limits()`; `deadline` then bounds the listing
    and each file)."""
    from .verify import verify_model
    say = say or (lambda text: print(text, file=sys.stderr))
    limits = limits or default_limits()
    plan = plan_download(directory, partition=partition, revision=revision, repo_id=repo_id, limits=limits)
    say(plan.summary())
    check_space(plan, free(plan.directory))
    record = _read_record(plan.directory)
    record.update({"repo_id": plan.repo_id, "revision": plan.revision, "commit": plan.commit})
    _write_record(plan.directory, record)
    fetched: list[str] = []
    groups = plan.groups
    for number, (key, items) in enumerate(groups.items(), 1):
        names = items[0].path + (f" (+ {len(items) - 1} identical)" if len(items) > 1 else "")
        source = plan.in_place.get(key)
        how = (f"identical to {source.relative_to(plan.directory)}: linked, not downloaded" if source is not None
               else format_bytes(items[0].size))
        say(f"[{number}/{len(groups)}] {names}, {how}")
        if source is None:
            _place(plan, _fetch(plan, key, items[0], progress=progress, limits=limits), items, record,
                   downloaded=True)
            fetched.append(items[0].path)
        else:
            _place(plan, source, items, record, downloaded=False)   # verified already: linked, not fetched
    # every hash is in the hash cache by now (put there as each file was placed): nothing to show
    report = verify_model(plan.directory, checksums=True, progress=False)
    if not report.ok:
        report.raise_for_errors()
    if plan.directory.joinpath(PARTS).is_dir() and not any(plan.directory.joinpath(PARTS).iterdir()):
        plan.directory.joinpath(PARTS).rmdir()
    return DownloadResult(plan=plan, fetched=fetched, report=report)
