"""safeio.outputs, the one atomic output write, and safeio.paths' size caps."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from h3bridge.errors import OutputExistsError, RequestError
from h3bridge.safeio import outputs
from h3bridge.safeio.paths import FileTooLargeError, not_regular, read_json_capped, read_regular_capped, too_large


def make_device(path: Path) -> Path:
    """A character device like /dev/zero (1, 5), made by the test in its own folder (root only)."""
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    return path


def hostile_names(tmp_path: Path) -> dict[str, Path]:
    """Every kind of name an output must never be written over, made in tmp_path."""
    folder = tmp_path / "a-folder"
    folder.mkdir()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    regular = tmp_path / "kept.txt"
    regular.write_text("the user's\n")
    link = tmp_path / "link"
    link.symlink_to(regular)
    names = {"folder": folder, "fifo": fifo, "dangling link": dangling, "link to a file": link}
    if os.geteuid() == 0:
        names["device"] = make_device(tmp_path / "device")
    return names


def snapshot(folder: Path) -> dict[str, tuple[int, int, bytes | str]]:
    """Each entry's kind, inode and (for files) bytes or (for links) target: what must not change."""
    state = {}
    for entry in sorted(folder.rglob("*")):
        info = os.lstat(entry)
        content: bytes | str = b""
        if stat.S_ISREG(info.st_mode):
            content = entry.read_bytes()
        elif stat.S_ISLNK(info.st_mode):
            content = os.readlink(entry)
        state[str(entry.relative_to(folder))] = (stat.S_IFMT(info.st_mode), info.st_ino, content)
    return state


@pytest.mark.parametrize("overwrite", [False, True])
def test_write_output_refuses_every_name_that_is_not_a_regular_file(tmp_path: Path, overwrite: bool) -> None:
    names = hostile_names(tmp_path)
    before = snapshot(tmp_path)
    for what, path in names.items():
        with pytest.raises(OutputExistsError) as caught:
            outputs.write_output(path, "new\n", overwrite=overwrite, field="-o")
        assert caught.value.before_start, what
        assert f"-o {path} already exists and is a" in caught.value.message, what
        assert "--overwrite" not in caught.value.hint, what          # overwriting would not help
    assert snapshot(tmp_path) == before


def test_write_output_without_overwrite_keeps_an_existing_file(tmp_path: Path) -> None:
    kept = tmp_path / "kept.txt"
    kept.write_text("the user's\n")
    with pytest.raises(OutputExistsError) as caught:
        outputs.write_output(kept, "new\n", overwrite=False, field="-o", allow_overwrite="pass --overwrite")
    assert caught.value.before_start and "--overwrite" in caught.value.hint
    assert kept.read_text() == "the user's\n" and sorted(os.listdir(tmp_path)) == ["kept.txt"]


def test_write_output_with_overwrite_replaces_a_regular_file_atomically(tmp_path: Path) -> None:
    kept = tmp_path / "kept.txt"
    kept.write_text("old\n")
    old_inode = kept.stat().st_ino
    outputs.write_output(kept, "new\n", overwrite=True)
    assert kept.read_text() == "new\n" and kept.stat().st_ino != old_inode     # a rename, not a rewrite
    assert os.listdir(tmp_path) == ["kept.txt"]


def test_write_output_makes_missing_folders_or_refuses_when_told_not_to(tmp_path: Path) -> None:
    deep = tmp_path / "a" / "b" / "out.txt"
    with pytest.raises(RequestError, match="does not exist"):
        outputs.write_output(deep, "x", overwrite=False, make_parents=False)
    assert not (tmp_path / "a").exists()
    outputs.write_output(deep, "x", overwrite=False)
    assert deep.read_text() == "x" and os.listdir(deep.parent) == ["out.txt"]


def test_check_output_refuses_a_parent_that_is_a_file_or_not_writable(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RequestError, match="not a writable folder"):
        outputs.check_output(blocker / "out.txt", overwrite=False)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.access(locked, os.W_OK):
        pytest.skip("root writes in any folder")
    with pytest.raises(RequestError, match="not writable"):
        outputs.check_output(locked / "out.txt", overwrite=False)


def test_publish_never_replaces_what_appeared_meanwhile(tmp_path: Path) -> None:
    """Checked before the work, then taken during it: a file, a FIFO, a device (as root)."""
    target = tmp_path / "out.bin"
    for make in (lambda: target.write_text("appeared\n"), lambda: os.mkfifo(target),
                 lambda: make_device(target)):
        outputs.check_output(target, overwrite=False)
        with pytest.raises(OutputExistsError) as caught:
            with outputs.staged_output(target, overwrite=False) as staging:
                staging.staged.write_bytes(b"work")
                make()
                staging.publish()
        assert not caught.value.before_start
        assert os.listdir(tmp_path) == ["out.bin"]          # the staged file is gone, the name kept as it was
        assert not stat.S_ISREG(os.lstat(target).st_mode) or target.read_text() == "appeared\n"
        target.unlink()


def test_publish_with_overwrite_never_replaces_a_device_that_appeared_meanwhile(tmp_path: Path) -> None:
    target = tmp_path / "out.yaml"
    outputs.check_output(target, overwrite=True)
    with pytest.raises(OutputExistsError, match="character device"):
        with outputs.staged_output(target, overwrite=True) as staging:
            staging.staged.write_bytes(b"work")
            make_device(target)
            staging.publish()
    assert stat.S_ISCHR(os.lstat(target).st_mode) and os.listdir(tmp_path) == ["out.yaml"]


def test_a_failure_or_cancel_while_staged_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "new" / "out.png"
    for failure in (OSError(28, "No space left on device"), KeyboardInterrupt()):
        with pytest.raises(type(failure)):
            with outputs.staged_output(target, overwrite=False) as staging:
                staging.staged.write_bytes(b"half")
                raise failure
        assert os.listdir(tmp_path) == []                   # neither the staged file nor the folder made for it


def test_publish_folder_never_replaces_an_empty_folder_that_appeared(tmp_path: Path) -> None:
    staged = tmp_path / ".staged"
    staged.mkdir()
    (staged / "model.safetensors").write_bytes(b"x")
    target = tmp_path / "folded"
    target.mkdir()                                          # a plain rename would replace it silently
    with pytest.raises(OutputExistsError):
        outputs.publish_folder(staged, target)
    assert list(target.iterdir()) == [] and (staged / "model.safetensors").exists()
    target.rmdir()
    outputs.publish_folder(staged, target)
    assert (target / "model.safetensors").read_bytes() == b"x" and not staged.exists()


def test_read_capped_refuses_a_file_over_the_callers_cap_before_reading_it(tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    record.write_bytes(b"{}" + b" " * 4096)
    with pytest.raises(FileTooLargeError) as caught:
        read_json_capped(record, 1024, not_regular, too_large)
    assert caught.value.size == 4098 and caught.value.cap == 1024
    assert read_json_capped(record, 8192, not_regular, too_large) == {}
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="named pipe"):
        read_regular_capped(fifo, 1024, not_regular, too_large)      # never waits on a writer


def test_overwrite_keeps_the_replaced_files_permissions(tmp_path: Path) -> None:
    private = tmp_path / "private.yaml"
    private.write_text("old\n")
    private.chmod(0o600)
    outputs.write_output(private, "new\n", overwrite=True)
    assert private.read_text() == "new\n" and stat.S_IMODE(private.stat().st_mode) == 0o600
