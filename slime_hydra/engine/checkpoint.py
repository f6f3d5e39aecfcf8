"""Checkpoints that survive the machine: HF weights (loadable by `from_pretrained`) plus the exact state to resume.

Layout: <save>/rollout_000010/{model.safetensors, config.json, tokenizer.json, ..., state.json, state.safetensors,
manifest.json} and <save>/latest naming the newest one. The state to resume is plain data (checkpoint_state.py:
nothing in it can run code when loaded). A trainer with its own checkpoint format (train.backend=megatron) adds its
own `megatron/` directory (model, optimizer, reference in megatron's distributed format) inside the same
checkpoint directory and keeps its state out of state.json.

Writing (save_checkpoint): everything goes into `<save>/.rollout_000010.tmp-<pid>` (megatron's ranks
write their shards there too); the manifest (every file and its size) is written last; every file and
directory in it is fsynced; then the directory is renamed to its final name and <save> fsynced, so a
checkpoint directory exists only once it is whole and on disk. `latest` is replaced afterwards the same
way (temp file, fsync, rename, fsync <save>). A crash at any moment leaves the previous checkpoint and
`latest` as they were, at worst plus a hidden `.tmp-<pid>` directory, which the next save into <save>
removes once its process is gone. A save that fails on the disk (full, read-only, quota) removes its
temporary directory and stops the run with exit code 2, naming the directory, the `save` and
`save_interval` keys, and the previous checkpoint, checked intact.

Loading (resolve_checkpoint, the rule documented at the schema's `load` key): a checkpoint named
directly must load, or the run stops naming the broken file; a save root resumes from the checkpoint
`latest` names, or, when that one is broken, from the newest older one that loads, with a warning
naming each one skipped. What "loads" means: checkpoint_verify.py. A state file that asks to run code (a
crafted pickle) is never skipped quietly: it stops the resolution, naming the file.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

from slime_hydra.engine import checkpoint_state
from slime_hydra.engine import checkpoint_verify as verify
from slime_hydra.errors import UserError
from slime_hydra.protocols import TrainBackend

log = logging.getLogger(__name__)

CHECKPOINT = re.compile(r"rollout_(\d+)")
PARTIAL = re.compile(r"\.(rollout_\d+|latest)\.(tmp|old)-(\d+)")  # our own unfinished writes: .<name>.tmp-<pid>


class CheckpointError(UserError):
    """A checkpoint that cannot be written or read; the message names the file and how to resume."""


def checkpoint_name(rollout_id: int) -> str:
    return f"rollout_{rollout_id:06d}"


def trainer_files(trainer: TrainBackend, tokenizer):
    """The `write_hf` of save_checkpoint: HF weights + tokenizer, and the trainer's own checkpoint if it has one."""

    def write(path: str) -> None:
        trainer.save_hf(path, tokenizer)
        trainer.save_checkpoint(path)  # megatron's <ckpt>/megatron/; a no-op for a trainer whose state is in the state files

    return write


# ---------------------------------------------------------------------------------------------- writing


def save_checkpoint(save_dir: str, rollout_id: int, write_hf: Callable[[str], None], state: dict[str, Any]) -> Path:
    """Writes <save_dir>/rollout_NNNNNN whole or not at all, then points `latest` at it."""
    root = Path(save_dir)
    final = root / checkpoint_name(rollout_id)
    try:
        root.mkdir(parents=True, exist_ok=True)
        remove_stale(root)
        tmp = root / f".{final.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            write_hf(str(tmp))
            checkpoint_state.write(tmp, state)
            write_manifest(tmp, rollout_id)
            fsync_tree(tmp)
            publish(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        write_latest(root, final.name)
    except Exception as e:
        if (cause := disk_error(e)) is None:
            e.add_note(previous_note(root))
            raise
        raise CheckpointError(save_failed(root, final, cause)) from e
    return final


def write_manifest(ckpt: Path, rollout_id: int) -> None:
    files = {str(p.relative_to(ckpt)): p.stat().st_size for p in sorted(ckpt.rglob("*")) if p.is_file()}
    (ckpt / verify.MANIFEST).write_text(json.dumps({"rollout_id": rollout_id, "files": files}, indent=1))


def fsync_tree(top: Path) -> None:
    """Every file's data and every directory's entries on disk, deepest first."""
    for dirpath, _, filenames in os.walk(top, topdown=False):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:  # some filesystems (and Windows) cannot fsync a directory; a rename there is what it is
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def publish(tmp: Path, final: Path) -> None:
    """tmp -> final in one rename; a checkpoint of the same rollout (a rerun from an older one) is replaced."""
    old = final.parent / f".{final.name}.old-{os.getpid()}"
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def write_latest(root: Path, name: str) -> None:
    tmp = root / f".latest.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / "latest")
    fsync_dir(root)


def remove_stale(root: Path) -> None:
    """Unfinished writes of processes that are gone (a kill mid-save); a live one's may still be in progress."""
    for p in root.iterdir():
        m = PARTIAL.fullmatch(p.name)
        if not m or int(m.group(3)) == os.getpid() or alive(int(m.group(3))):
            continue
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


DISK_ERRNOS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
               errno.EROFS: "read-only file system", errno.EIO: "I/O error", errno.EACCES: "permission denied",
               errno.EPERM: "operation not permitted"}


def disk_error(e: BaseException) -> Optional[str]:
    """What went wrong on the disk, if that is why `e` was raised: an OSError in its chain, or the writers'
    own wording (torch's zip writer and safetensors report a full disk as RuntimeError / SafetensorError)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in DISK_ERRNOS:
            return f"{DISK_ERRNOS[e.errno]} ({e})"
        text = str(e)
        for code, what in DISK_ERRNOS.items():
            if os.strerror(code) in text or f"os error {code})" in text:
                return f"{what} ({text[:300]})"
        e = e.__cause__ or e.__context__
    return None


def previous_note(root: Path) -> str:
    try:
        prev = pick(root, warn=False)
    except (CheckpointError, checkpoint_state.UnsafeState, OSError):
        return f"there is no earlier checkpoint in {root} that loads"
    return f"the previous checkpoint {prev} is intact (checked); load={root} resumes from it"


def save_failed(root: Path, final: Path, cause: str) -> str:
    return (f"saving checkpoint {final} failed: {cause}. Nothing of this save was left behind; "
            f"{previous_note(root)}. Free space on that disk, point `save` at another disk (save={root} now), or save "
            f"less often (raise save_interval; the last rollout is always saved), then resume with load={root}")


# ---------------------------------------------------------------------------------------------- loading


def resolve_checkpoint(load: str) -> Path:
    """The checkpoint that `load` names, checked whole: a checkpoint directory, or a save root (see module doc)."""
    p = Path(load)
    if PARTIAL.fullmatch(p.name):
        raise CheckpointError(f"load={load}: an unfinished save (a run stopped while writing it), not a checkpoint; "
                              f"set load={p.parent} to resume from the newest checkpoint there that loads")
    if is_save_root(p):
        return pick(p, warn=True)
    looks_like_one = CHECKPOINT.fullmatch(p.name) or any((p / f).exists() for f in (*verify.STATE_FILES, verify.MANIFEST))
    if not looks_like_one:
        raise CheckpointError(f"load={load}: neither a checkpoint (no {checkpoint_state.TREE}) nor a save directory (no 'latest' "
                              "file, no rollout_NNNNNN directories); point load at a directory written by save"
                              + ("; a Hugging Face model to start from goes in model.hf_checkpoint"
                                 if (p / "config.json").is_file() else ""))
    if found := verify.problems(p):
        hint = (f"set load={p.parent} to resume from the newest checkpoint there that loads (a checkpoint named directly "
                "is never swapped for another)") if is_save_root(p.parent) else "point load at another checkpoint"
        raise CheckpointError(f"load={load}: the checkpoint is broken:\n" + bullets(found) + f"\n{hint}")
    return p


def is_save_root(p: Path) -> bool:
    return p.is_dir() and ((p / "latest").is_file() or any(numbered(p)))


def numbered(root: Path) -> dict[int, Path]:
    return {int(m.group(1)): d for d in root.iterdir() if (m := CHECKPOINT.fullmatch(d.name)) and d.is_dir()}


def pick(root: Path, warn: bool) -> Path:
    """`latest`'s checkpoint if whole, else the newest older one that is. Newer ones than `latest` are never
    taken: they belong to a run that stopped between publishing a checkpoint and updating `latest`, or to an
    earlier run superseded by a rerun from an older checkpoint into the same save root; which one, only the
    user knows (load=<that directory> takes it)."""
    found, latest = numbered(root), read_latest(root)
    head = int(CHECKPOINT.fullmatch(latest).group(1)) if latest else max(found, default=-1)
    if latest and latest not in {d.name for d in found.values()}:
        found[head] = root / latest  # missing: reported below like any broken one
    newer = [found[k].name for k in sorted(found) if k > head]
    if newer and warn:
        log.warning("load=%s: not resuming from %s, newer than `latest` (%s) and so never confirmed by the run that "
                    "wrote it; set load=%s to take it", root, ", ".join(newer), latest, root / newer[-1])
    skipped = []
    for k in sorted((k for k in found if k <= head), reverse=True):
        if not (why := verify.problems(found[k])):
            if skipped and warn:
                for name, w in skipped:
                    log.warning("load=%s: skipped %s, which does not load: %s; resuming from %s", root, name,
                                "; ".join(w), found[k])
            return found[k]
        skipped.append((found[k].name, why))
    if not skipped:
        raise CheckpointError(f"load={root}: no checkpoint in this save root (`latest`: {latest or 'none'}); point "
                              "load at a directory written by save, or start without load")
    raise CheckpointError(f"load={root}: no checkpoint in this save root loads:\n"
                          + bullets([f"{n}: {'; '.join(w)}" for n, w in skipped])
                          + "\nstart without load (a fresh run), or point load at a checkpoint kept elsewhere")


def read_latest(root: Path) -> Optional[str]:
    try:
        name = (root / "latest").read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not CHECKPOINT.fullmatch(name):
        if name or (root / "latest").exists():
            log.warning("load=%s: `latest` holds %r, not a checkpoint name; taking the newest checkpoint that loads",
                        root, name[:80])
        return None
    return name


def bullets(lines: list[str]) -> str:
    return "\n".join(f"  - {line}" for line in lines)


def load_state(ckpt: Path) -> dict[str, Any]:
    """The state `save_checkpoint` wrote (plain data: nothing in it runs when loaded)."""
    ckpt = Path(ckpt)
    try:
        return checkpoint_state.read(ckpt)
    except checkpoint_state.UnsafeState:
        raise
    except Exception as e:  # checked by resolve_checkpoint, so only a file changed since, or a foreign one, gets here
        where = ", ".join(str(f) for f in checkpoint_state.files(ckpt))
        raise CheckpointError(f"{where}: does not load ({type(e).__name__}: {str(e)[:300]}); point load at the save root "
                              f"{ckpt.parent} to resume from the newest checkpoint there that loads") from e


def resume_hint(save_dir: str) -> str:
    """Where a failed run resumes from: the newest checkpoint, or that there is none."""
    root = Path(save_dir).resolve()
    if (root / "latest").is_file():
        return f"The last checkpoint is {root / (root / 'latest').read_text().strip()}: resume with load={root}."
    return f"No checkpoint was saved yet (save_interval sets how often; checkpoints go to {save_dir})."
