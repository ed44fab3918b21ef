"""Every fold refusal comes before a byte is written; a fold interrupted or killed leaves no model."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from lora_helpers import FOLD_KERNELS, low_rank, tensor_shapes, use_fold_kernel, write_lora
import model_helpers
from model_helpers import copy_model
from h3bridge import inspect_model
from h3bridge.cli.main import main
from h3bridge.errors import DiskError, LoraError, OutputExistsError, RequestError
from h3bridge.lora import LoraSpec, fold_model
from h3bridge.lora import fold as fold_module

template = model_helpers.template      # the module's fixture model (tests/model_helpers.py)

QKV = "attn.qkv_proj.weight"


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(tmp_path.with_name(tmp_path.name + "-cache")))


def _pair(module: str, out: int, inner: int, rank: int = 2, seed: int = 0) -> dict[str, np.ndarray]:
    up, down = low_rank(np.random.default_rng(seed), out, inner, rank)
    return {module + ".lora_A.weight": down, module + ".lora_B.weight": up}


def _good(template: Path) -> dict[str, np.ndarray]:
    shapes = tensor_shapes(template)
    tensors: dict[str, np.ndarray] = {}
    for i in range(3):
        out, inner = shapes[f"blocks.{i}.{QKV}"][2]
        tensors.update(_pair(f"blocks.{i}.attn.qkv_proj", out, inner, seed=i))
    return tensors


def _nothing_written(folder: Path, before: set[str]) -> None:
    assert {p.name for p in folder.iterdir()} == before, "a refusal wrote something"


def _refused(template: Path, tmp_path: Path, tensors: dict[str, np.ndarray], *, dtypes=None,
             model: Path | None = None) -> LoraError:
    lora = write_lora(tmp_path / "bad.safetensors", tensors, dtypes=dtypes)
    before = {p.name for p in tmp_path.iterdir()}
    with pytest.raises(LoraError) as caught:
        fold_model(model or template, [LoraSpec(lora)], tmp_path / "out", progress=False)
    _nothing_written(tmp_path, before)
    assert caught.value.before_start and caught.value.hint
    return caught.value


def test_keys_matching_nothing_are_refused_with_examples(template: Path, tmp_path: Path) -> None:
    tensors = {**_good(template), **_pair("blocks.0.attn.proj_q", 8, 8), **_pair("diffusion_model.nope.layer", 8, 8)}
    error = _refused(template, tmp_path, tensors)
    assert "2 LoRA module(s) match no tensor" in error.message
    assert "blocks.0.attn.proj_q" in error.message and "diffusion_model.nope.layer" in error.message


def test_text_encoder_modules_are_named_as_such(template: Path, tmp_path: Path) -> None:
    error = _refused(template, tmp_path, {**_good(template), **_pair("lora_te_text_model_layers_0_q", 8, 8)})
    assert "for the text encoder" in error.message


def test_shapes_that_do_not_fit_are_refused(template: Path, tmp_path: Path) -> None:
    tensors = _good(template)
    tensors["blocks.1.attn.qkv_proj.lora_B.weight"] = np.zeros((25, 2), np.float32)   # out is 24
    tensors["blocks.2.attn.qkv_proj.lora_A.weight"] = np.zeros((3, 8), np.float32)    # rank 3 vs 2
    error = _refused(template, tmp_path, tensors)
    assert "2 LoRA module(s) do not fit" in error.message and "[25, 2]" in error.message and "[24, 8]" in error.message


def test_lora_dtypes_that_cannot_be_folded_are_refused(template: Path, tmp_path: Path) -> None:
    tensors = _good(template)
    error = _refused(template, tmp_path, tensors, dtypes={"blocks.0.attn.qkv_proj.lora_A.weight": "F8_E4M3"})
    assert "F8_E4M3" in error.message and "quantized" in error.message
    error = _refused(template, tmp_path, tensors, dtypes={"blocks.0.attn.qkv_proj.lora_A.weight": "I32"})
    assert "I32" in error.message and "cannot be folded" in error.message


def test_targets_h3_reads_in_another_dtype_are_refused(template: Path, tmp_path: Path) -> None:
    """A model whose targeted tensor is F16 (same size as BF16: only the header's dtype changes)."""
    model = copy_model(template, tmp_path / "m")
    shard = next(s for s in sorted((model / "FL2VA/transformer").glob("*.safetensors"))
                 if b'"blocks.0.attn.qkv_proj.weight":{"dtype":"BF16"' in s.read_bytes()[:200_000])
    data = shard.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = data[8:8 + size].replace(b'"blocks.0.attn.qkv_proj.weight":{"dtype":"BF16"',
                                      b'"blocks.0.attn.qkv_proj.weight":{"dtype":"F16"', 1) + b" "
    shard.write_bytes(data[:8] + header + data[8 + size:])
    assert not inspect_model(model).errors
    error = _refused(template, tmp_path, _good(template), model=model)
    assert "blocks.0.attn.qkv_proj.weight is F16" in error.message


def test_unpaired_and_full_diff_tensors_are_refused(template: Path, tmp_path: Path) -> None:
    tensors = {**_good(template), "blocks.3.attn.qkv_proj.lora_A.weight": np.zeros((2, 8), np.float32),
               "blocks.4.norm1.diff_b": np.zeros((8,), np.float32)}
    error = _refused(template, tmp_path, tensors)
    assert "no part of a down/up pair" in error.message and "blocks.4.norm1.diff_b" in error.message


def test_a_file_without_lora_pairs_and_a_missing_file_are_refused(template: Path, tmp_path: Path) -> None:
    error = _refused(template, tmp_path, {"blocks.0.attn.qkv_proj.weight": np.zeros((24, 8), np.float32)})
    assert "holds no LoRA pairs" in error.message
    with pytest.raises(LoraError, match="does not exist"):
        fold_model(template, [tmp_path / "missing.safetensors"], tmp_path / "out", progress=False)


def test_output_and_strength_refusals(template: Path, tmp_path: Path) -> None:
    lora = write_lora(tmp_path / "l.safetensors", _good(template))
    (tmp_path / "exists").mkdir()
    with pytest.raises(OutputExistsError):
        fold_model(template, [lora], tmp_path / "exists", progress=False)
    with pytest.raises(RequestError, match="inside the model folder"):
        fold_model(template, [lora], template / "folded", progress=False)
    with pytest.raises(RequestError, match="not a finite number"):
        fold_model(template, [LoraSpec(lora, float("nan"))], tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists() and not (template / "folded").exists()


def test_a_disk_without_room_is_refused_first(template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil
    from collections import namedtuple
    lora = write_lora(tmp_path / "l.safetensors", _good(template))
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 100, 100))
    before = {p.name for p in tmp_path.iterdir()}
    with pytest.raises(DiskError) as caught:
        fold_model(template, [lora], tmp_path / "out", progress=False)
    assert caught.value.before_start and "for the folded model" in caught.value.message
    _nothing_written(tmp_path, before)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("entry, make", [
    ("notes.txt", "fifo"),
    ("notes.txt", "dev-zero"),
    ("FL2VA/text_encoder/model.safetensors.index.json", "dev-zero"),
    ("extras/stray.safetensors", "dev-zero"),
])
def test_a_fifo_or_device_in_the_base_is_refused_before_a_byte_is_written(
        template: Path, tmp_path: Path, entry: str, make: str) -> None:
    """Issue 19 item 3: `lora fold` copies every file of the base; a FIFO hung it and a link to
    /dev/zero (notes.txt, an index JSON, a stray *.safetensors) wrote until the disk was full."""
    base = copy_model(template, tmp_path / "base")
    special = base / entry
    special.parent.mkdir(parents=True, exist_ok=True)
    special.unlink(missing_ok=True)
    if make == "fifo":
        os.mkfifo(special)
    else:
        special.symlink_to("/dev/zero")
    (tmp_path / "out-parent").mkdir()
    lora = write_lora(tmp_path / "l.safetensors", _good(template))
    with pytest.raises(LoraError) as caught:
        fold_model(base, [lora], tmp_path / "out-parent" / "out", progress=False)
    error = caught.value
    kind = "a named pipe (FIFO)" if make == "fifo" else "a character device (a symbolic link to /dev/zero)"
    assert error.before_start and f"{special}, which is {kind}" in error.message
    assert f"rm {special}" in (error.hint or "")
    assert list((tmp_path / "out-parent").iterdir()) == []


def test_cli_refusal_exits_2_naming_the_problem(template: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    lora = write_lora(tmp_path / "l.safetensors", _pair("blocks.0.attn.proj_q", 8, 8))
    assert main(["lora", "fold", str(template), "--lora", f"{lora}:0.5", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "match no tensor" in err and "fix:" in err and not (tmp_path / "out").exists()


def test_an_error_midway_removes_everything(template: Path, tmp_path: Path) -> None:
    lora = write_lora(tmp_path / "l.safetensors", _good(template))
    before = {p.name for p in tmp_path.iterdir()}
    calls = []

    def interrupt(event) -> None:
        calls.append(event)
        raise KeyboardInterrupt        # what Ctrl-C raises

    with pytest.raises(KeyboardInterrupt):
        fold_model(template, [lora], tmp_path / "out", progress=False, on_progress=interrupt)
    assert calls and calls[0].phase == "fold"
    _nothing_written(tmp_path, before)


_CHILD = textwrap.dedent("""
    import sys
    from h3bridge.lora import fold_model

    def reached(event):
        print("reached", event.done, flush=True)     # the parent kills us once it reads this
        sys.stdin.read()                              # blocks until killed

    fold_model(sys.argv[1], [sys.argv[2]], sys.argv[3], progress=False, on_progress=reached)
""")


def test_a_fold_killed_midway_leaves_nothing_that_looks_like_a_model(template: Path, tmp_path: Path) -> None:
    lora = write_lora(tmp_path / "l.safetensors", _good(template))
    output = tmp_path / "out"
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(template), str(lora), str(output)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()                # the first tensor block is written: mid-fold
        assert line.startswith("reached"), line
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
        child.stdin.close()
        child.stdout.close()
    assert not output.exists()
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".out" + fold_module.TEMP_MARK)]
    assert len(leftovers) == 1                          # hidden, and no model:
    assert inspect_model(leftovers[0]).errors, "a killed fold's folder passes as a model"
    assert list(leftovers[0].rglob("*" + fold_module.PARTIAL_SUFFIX))     # the shard it was writing
    # the next fold into the same place removes it and publishes a complete model
    fold_model(template, [lora], output, progress=False)
    assert not leftovers[0].exists() and not inspect_model(output).errors


@pytest.mark.parametrize("kernel", FOLD_KERNELS)
def test_the_parity_probe_stops_a_wrong_block_before_it_is_written(template: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch, kernel: str) -> None:
    """A block whose encoded values are one bf16 step off (a rounding or arithmetic bug) is caught by
    the independent recomputation, whichever code folded it; the fold stops and leaves nothing."""
    lora = write_lora(tmp_path / "l.safetensors", _good(template))
    use_fold_kernel(monkeypatch, kernel)
    if kernel == "numpy":
        right = fold_module._encode_rows

        def one_step_off(values: np.ndarray, dtype: str, *rounding) -> np.ndarray:
            encoded = right(values, dtype, *rounding).copy()
            encoded[0, 0] += 1           # the next bf16 value in magnitude
            return encoded

        monkeypatch.setattr(fold_module, "_encode_rows", one_step_off)
    else:
        from h3bridge.lora import compiled
        kernels = compiled.stochastic_bf16

        def first_one_step_off(raw: np.ndarray, term: np.ndarray, factor: float, first: int, *rest) -> None:
            kernels(raw, term, factor, first, *rest)
            encoded = rest[2]
            encoded.reshape(-1)[0] += 1  # the first element of each piece: row 0 column 0 among them

        monkeypatch.setattr(compiled, "stochastic_bf16", first_one_step_off)
    before = {p.name for p in tmp_path.iterdir()}
    with pytest.raises(LoraError, match="parity probe failed for blocks.0.attn.qkv_proj.weight row 0 column 0") as caught:
        fold_model(template, [lora], tmp_path / "out", progress=False)
    assert not caught.value.before_start          # a failure midway (exit 1), not a refusal
    _nothing_written(tmp_path, before)


def test_a_folder_that_appears_at_the_output_while_folding_is_never_replaced(template: Path, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The last rename gave the folded model the output's name even over an empty folder that
    appeared meanwhile (rename(2) replaces an empty folder): now the name must be free."""
    lora = write_lora(tmp_path / "l.safetensors", _good(template))
    output = tmp_path / "out"
    real = fold_module.write_provenance

    def someone_makes_the_folder(root: Path, provenance) -> None:
        real(root, provenance)
        output.mkdir()
        (tmp_path / "marker").write_text("")
    monkeypatch.setattr(fold_module, "write_provenance", someone_makes_the_folder)
    with pytest.raises(OutputExistsError) as caught:
        fold_model(template, [lora], output, progress=False)
    assert not caught.value.before_start and list(output.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.safetensors", "marker", "out"]     # no staging folder


@pytest.mark.parametrize("what", ["fifo", "dangling link", "device", "file"])
def test_lora_fold_o_that_is_taken_exits_2_before_folding(template: Path, tmp_path: Path, what: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    import stat
    lora = write_lora(tmp_path / "l.safetensors", _good(template))
    output = tmp_path / "out"
    if what == "fifo":
        os.mkfifo(output)
    elif what == "dangling link":
        output.symlink_to(tmp_path / "nowhere")
    elif what == "file":
        output.write_text("mine")
    else:
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        os.mknod(output, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    before = os.lstat(output)
    assert main(["lora", "fold", str(template), "--lora", str(lora), "-o", str(output), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert str(output) in err and "already exists" in err and "Traceback" not in err
    assert (os.lstat(output).st_mode, os.lstat(output).st_ino) == (before.st_mode, before.st_ino)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.safetensors", "out"]


def test_lora_fold_into_a_folder_that_takes_no_files_exits_2_before_folding(template: Path, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    lora = write_lora(tmp_path / "l.safetensors", _good(template))
    blocker = tmp_path / "notes"
    blocker.write_text("a file, not a folder")
    assert main(["lora", "fold", str(template), "--lora", str(lora), "-o", str(blocker / "out"), "--quiet"]) == 2
    assert "Traceback" not in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.safetensors", "notes"]


def _pad_header(path: Path, padding: int) -> Path:
    """`path` rewritten with `padding` more spaces at the end of its JSON header (still valid JSON,
    still 8-aligned): what a hostile LoRA of '200 MiB of spaces' looks like."""
    import struct
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = data[8:8 + size] + b" " * padding
    path.write_bytes(struct.pack("<Q", len(header)) + header + data[8 + size:])
    return path


def test_a_lora_whose_header_is_mostly_spaces_is_refused_before_it_is_read(template: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29 item 5: a LoRA whose header is 200 MiB of spaces was read whole and accepted. A
    LoRA's header is kilobytes; the read is capped (LORA_MAX_HEADER_BYTES) before a byte of it."""
    from h3bridge.lora import keys as keys_module
    from h3bridge.lora.keys import read_lora
    cap = keys_module.LORA_MAX_HEADER_BYTES
    assert cap < 200 * 1024 * 1024
    monkeypatch.setattr(keys_module, "LORA_MAX_HEADER_BYTES", 1 << 20)     # the same rule, a smaller file
    lora = _pad_header(write_lora(tmp_path / "spaces.safetensors", _good(template)), (1 << 20) + 8)
    with pytest.raises(LoraError) as caught:
        read_lora(lora)
    assert "over the 1 MiB limit" in caught.value.message and caught.value.hint
    read_lora(_pad_header(write_lora(tmp_path / "fine.safetensors", _good(template)), 4096))    # a little is fine


def test_a_200_mib_header_of_spaces_is_refused_by_lora_fold(template: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    lora = _pad_header(write_lora(tmp_path / "spaces.safetensors", _good(template)), 200 * 1024 * 1024)
    assert main(["lora", "fold", str(template), "--lora", str(lora), "-o", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "spaces.safetensors" in err and "header" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
    lora.unlink()


def test_a_fold_record_of_megabytes_of_spaces_is_damaged_not_read(template: Path, tmp_path: Path) -> None:
    """The fold record is read with a cap (safeio.paths): past it, 'damaged', never read into memory."""
    from h3bridge.lora import read_provenance
    from h3bridge.model.fold_record import MAX_RECORD_BYTES, PROVENANCE_FILE
    folded = tmp_path / "folded"
    fold_model(template, [write_lora(tmp_path / "l.safetensors", _good(template))], folded, progress=False)
    assert read_provenance(folded) is not None
    record = folded / PROVENANCE_FILE
    record.write_bytes(record.read_bytes() + b" " * MAX_RECORD_BYTES)
    with pytest.raises(ValueError, match="damaged"):
        read_provenance(folded)


@pytest.mark.timeout(60)
def test_a_fifo_planted_as_a_stale_folds_marker_is_not_waited_on(tmp_path: Path) -> None:
    """remove_stale_folds read the marker of every `.OUT.partial-*` folder with read_text(): a FIFO
    there hung `lora fold -o OUT` for good. Now it is read through safeio.paths (a FIFO is refused
    unopened) and the folder, whose owner cannot be told, is a dead fold's."""
    stale = tmp_path / f".out{fold_module.TEMP_MARK}12345-abcd"
    stale.mkdir()
    os.mkfifo(stale / fold_module.INCOMPLETE_FILE)
    assert fold_module.remove_stale_folds(tmp_path / "out") == [stale]
    assert list(tmp_path.iterdir()) == []
