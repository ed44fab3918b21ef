"""h3-sim's command line against upstream main.c (parsing, getopt_long, exit codes, order)."""
from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path

import pytest

from h3bridge.sim.cli import LONG_OPTIONS, USAGE
from h3bridge.sim.getopt import GetoptLong
from sim_helpers import make_model, run_sim, run_sim_process, sim_program

USAGE_H3 = USAGE.format("h3")
MISSING = "/nonexistent-h3-sim-model"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("sim-cli") / "model")


def scan(*args: str) -> tuple[list[tuple[object, str | None]], list[str], str]:
    """Drive GetoptLong like main.c's loop: (options, remaining operands, stderr)."""
    err = io.StringIO()
    parser = GetoptLong(["h3", *args], "d:p:o:h", LONG_OPTIONS, stderr=err)
    seen = []
    while (option := parser.next()) is not None:
        seen.append((option, parser.optarg))
    return seen, parser.argv[parser.optind:], err.getvalue()


def test_usage_text_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    help_run = run_sim(capsys, "-h")
    assert (help_run.code, help_run.out, help_run.err) == (0, "", USAGE_H3)
    assert USAGE_H3.startswith("Usage: h3 -d MODEL_DIR [options]              # interactive\n")
    long_help = run_sim(capsys, "--help", "--bogus")   # -h returns before later errors
    assert long_help.code == 0
    no_model = run_sim(capsys, "-p", "x")
    assert (no_model.code, no_model.err) == (2, USAGE_H3)


def test_getopt_diagnostics_then_usage(capsys: pytest.CaptureFixture[str]) -> None:
    # macOS libc's texts (Apple Libc stdlib/FreeBSD/getopt_long.c, GNU_COMPATIBLE, via warnx):
    # the real h3 only runs on macOS. Long names are quoted `--like this' and printed as typed.
    cases = {
        ("--bogus",): "h3: unrecognized option `--bogus'\n",
        ("--bogus=1",): "h3: unrecognized option `--bogus=1'\n",
        ("-x",): "h3: invalid option -- x\n",
        ("-d",): "h3: option requires an argument -- d\n",
        ("-d", "m", "--width"): "h3: option `--width' requires an argument\n",
        ("-d", "m", "--wid"): "h3: option `--wid' requires an argument\n",
        ("--info=yes",): "h3: option `--info' doesn't allow an argument\n",
        ("--inf=yes",): "h3: option `--inf' doesn't allow an argument\n",
        ("--pro", "x"): "h3: option `--pro' is ambiguous\n",
        ("--pro=x",): "h3: option `--pro' is ambiguous\n",
        ("--use-slower-bf16",): "h3: option `--use-slower-bf16' is ambiguous\n",
        ("--b\x01\x07\t",): "h3: unrecognized option `--b\\001\\a\t'\n",   # err.c _e_visprintf
    }
    for args, message in cases.items():
        result = run_sim(capsys, *args)
        assert (result.code, result.err) == (2, message + USAGE_H3), args


def test_getopt_short_options_are_bytes_and_posix_wording(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # "-é" is two C chars; the first (0xC3) is the unknown option, printed as a raw byte.
    _, _, err = scan("-\u00e9")
    first_error = err.encode("utf-8", "surrogateescape").split(b"\n")[0]
    assert first_error == b"h3: invalid option -- \xc3"   # main.c stops at this first '?'
    process = subprocess.run([sim_program(), "-\u00e9"], capture_output=True)
    name = Path(sim_program()).name.encode()
    assert process.returncode == 2
    assert process.stderr.startswith(name + b": invalid option -- \xc3\nUsage: ")
    monkeypatch.setenv("POSIXLY_CORRECT", "1")
    _, _, err = scan("-x")
    assert err == "h3: illegal option -- x\n"


def test_getopt_names_the_program_by_basename(capsys: pytest.CaptureFixture[str]) -> None:
    # warnx prints getprogname() (last component of argv[0]); usage() prints argv[0] itself.
    err = io.StringIO()
    parser = GetoptLong(["/opt/h3/bin/h3", "--bogus"], "d:p:o:h", LONG_OPTIONS, stderr=err)
    assert parser.next() == "?"
    assert err.getvalue() == "h3: unrecognized option `--bogus'\n"


def test_abbreviations_equals_attached_and_permutation() -> None:
    seen, rest, err = scan("--mod=M", "--promp", "a fox", "-oout.mp4", "operand", "--wid", "64",
                           "--ssd", "-pP2", "--", "-p", "late")
    assert err == ""
    assert seen == [("d", "M"), ("p", "a fox"), ("o", "out.mp4"), ("width", "64"),
                    ("ssd-streaming", None), ("p", "P2")]
    assert rest == ["operand", "-p", "late"]   # non-options permuted after the options


def test_posixly_correct_stops_at_first_operand(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSIXLY_CORRECT", "1")
    seen, rest, _ = scan("-d", "M", "operand", "-p", "x")
    assert seen == [("d", "M")] and rest == ["operand", "-p", "x"]


@pytest.mark.parametrize("args,message", [
    (("--width", "abc"), "h3: invalid width: abc"),
    (("--width", "-32"), "h3: invalid width: -32"),
    (("--width", "2147483648"), "h3: invalid width: 2147483648"),
    (("--width", "64 "), "h3: invalid width: 64 "),
    (("--width", ""), "h3: invalid width: "),
    (("--height", "1e3"), "h3: invalid height: 1e3"),
    (("--render-width", "x"), "h3: invalid render width: x"),
    (("--render-height", "x"), "h3: invalid render height: x"),
    (("--frames", "0x10"), "h3: invalid frames: 0x10"),
    (("--steps", "two"), "h3: invalid steps: two"),
    (("--reuse", "1.5"), "h3: invalid reuse: 1.5"),
    (("--layers", "fifty"), "h3: invalid layers: fifty"),
    (("--core-reuse", "-"), "h3: invalid core reuse: -"),
    (("--zoom", "z"), "h3: invalid zoom: z"),
    (("--seed", "4x"), "h3: invalid seed: 4x"),
    (("--seed", "18446744073709551616"), "h3: invalid seed: 18446744073709551616"),
    (("--seconds", "0"), "h3: invalid seconds: 0"),
    (("--seconds", "-1"), "h3: invalid seconds: -1"),
    (("--seconds", "nan"), "h3: invalid seconds: nan"),
    (("--seconds", "inf"), "h3: invalid seconds: inf"),
    (("--seconds", "0.01"), "h3: invalid seconds: 0.01"),
    (("--seconds", "2s"), "h3: invalid seconds: 2s"),
    (("--zoom", "0"), "h3: --zoom must be at least 1"),
    (("--ref-image-size", "big"), "h3: --ref-image-size must be match or max"),
    (("--ref-video-audio", "v.mp4"), "h3: --ref-video-audio requires VIDEO and AUDIO"),
    (("--frames", "56", "--seconds", "2"), "h3: --seconds and --frames are mutually exclusive"),
])
def test_parse_errors_exit_2_before_model_load(capsys: pytest.CaptureFixture[str],
                                               args: tuple[str, ...], message: str) -> None:
    result = run_sim(capsys, "-d", MISSING, "-p", "x", *args)
    assert (result.code, result.err) == (2, message + "\n")


def test_number_forms_strtol_accepts(capsys: pytest.CaptureFixture[str]) -> None:
    # Leading blanks and '+' pass strtol; they reach the model load (exit 1), not exit 2.
    for args in (("--width", " 64"), ("--width", "+64"), ("--seconds", "2.5"),
                 ("--seconds", "0x1p1"), ("--seed", "-1")):
        result = run_sim(capsys, "-d", MISSING, "-p", "x", *args)
        assert result.code == 1 and "missing required model file" in result.err, args


def test_reference_limit_is_a_parse_error(capsys: pytest.CaptureFixture[str]) -> None:
    refs = [arg for index in range(13) for arg in ("--ref-image", f"img{index}.png")]
    result = run_sim(capsys, "-d", MISSING, "-p", "x", *refs)
    assert (result.code, result.err) == (2, "h3: Ref2VA supports at most 12 references\n")


def test_reuse_warning_then_load(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_sim(capsys, "-d", MISSING, "-p", "x", "--steps", "4", "--reuse", "2")
    assert result.err.splitlines() == [
        "h3: warning: --reuse with only 4 denoising steps leaves very few fresh model evaluations",
        f"h3: missing required model file: {MISSING}/FL2VA/transformer/config.json"]
    assert result.code == 1
    quiet = run_sim(capsys, "-d", MISSING, "--info", "--steps", "4", "--reuse", "2")
    assert "warning" not in quiet.err          # only with -p (main.c:475)


def test_frames_dir_created_one_level_before_load(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    deep = tmp_path / "a" / "b"
    result = run_sim(capsys, "-d", MISSING, "-p", "x", "--frames-dir", str(deep))
    assert (result.code, result.err) == (
        1, f"h3: cannot create frames directory {deep}: No such file or directory\n")
    one = tmp_path / "frames"
    result = run_sim(capsys, "-d", MISSING, "-p", "x", "--frames-dir", str(one))
    assert one.is_dir() and "missing required model file" in result.err
    again = run_sim(capsys, "-d", MISSING, "-p", "x", "--frames-dir", str(one))   # EEXIST is fine
    assert "frames directory" not in again.err


def test_ref_video_audio_takes_next_argv_element_verbatim(capsys: pytest.CaptureFixture[str],
                                                          model: Path, tmp_path: Path) -> None:
    # AUDIO is argv[optind] even when it looks like an option; "--seed" becomes the audio path
    # and the scan continues with -p.  The failure shows where "--seed" went.
    missing_video = tmp_path / "nope.mp4"
    result = run_sim(capsys, "-d", str(model), "--ref-video-audio", str(missing_video), "--seed",
                     "-p", "x", "--width", "64", "--height", "64")
    assert result.code == 1
    assert result.err.endswith(f"h3: FFprobe could not inspect visual stream {missing_video}\n")


def test_info_prints_device_and_inventory(capsys: pytest.CaptureFixture[str], model: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3_SIM_DEVICE_NAME", "Apple M4 Pro")
    monkeypatch.setenv("H3_SIM_DEVICE_ARCHITECTURE", "applegpu_g16s")
    monkeypatch.setenv("H3_SIM_PHYSICAL_MEMORY", "24G")
    monkeypatch.setenv("H3_SIM_GPU_FAMILY", "9")
    monkeypatch.setenv("H3_SIM_METAL4", "0")
    result = run_sim(capsys, "-d", str(model), "--info")
    assert result.code == 0 and result.err == ""
    lines = result.out.splitlines()
    assert lines[:9] == [
        "h3-metal 0.1.0-dev", "Device: Apple M4 Pro (applegpu_g16s)",
        "  physical memory       24.0 GiB", "  recommended GPU set   18.0 GiB",
        "  max Metal buffer      12.0 GiB", "  Apple GPU family      9", "  Metal 4               no",
        "  unified memory        yes", "Native checkpoint inventory (header-only):"]
    labels = [line[2:20].rstrip() for line in lines[9:]]
    assert labels == ["Qwen3-VL encoder", "FL2VA DiT", "Ref2VA DiT", "video VAE", "audio VAE"]
    from h3bridge.sim.st_header import inventory_dir
    dit = inventory_dir(f"{model}/FL2VA/transformer")
    assert lines[10] == (f"  {'FL2VA DiT':<18} {dit.files:2d} files  {dit.tensors:4d} tensors  "
                         f"{dit.tensor_bytes / 1024**3:7.3f} GiB")


def test_console_script_uses_invoked_name_and_logs(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    result = run_sim_process("--bogus", env={"H3_SIM_LOG": str(log)}, cwd=tmp_path)
    assert result.returncode == 2
    program = json.loads(log.read_text().splitlines()[0])["argv"][0]
    assert result.stderr.startswith(f"{Path(program).name}: unrecognized option `--bogus'\n"
                                    f"Usage: {program} -d")
    entry = json.loads(log.read_text())
    assert entry["argv"][1:] == ["--bogus"] and entry["cwd"] == str(tmp_path)


def test_non_utf8_argv_bytes_come_back_verbatim(tmp_path: Path) -> None:
    # C prints the path bytes as given; Python's default stderr would print "\udce9".
    missing = bytes(tmp_path) + b"/mod\xe9le"
    process = subprocess.run([sim_program(), "-d", missing, "-p", "x"], capture_output=True)
    assert process.returncode == 1
    assert process.stderr == (b"h3: missing required model file: " + missing
                              + b"/FL2VA/transformer/config.json\n")


def test_frames_near_int32_max_wrap_in_alignment(capsys: pytest.CaptureFixture[str], model: Path) -> None:
    # h3_align_frame_count (h3_host.c:15-21) overflows int; the wrapped negative count passes
    # h3_valid_params' "> 362" test and fails h3_generate's 22-frame test (h3.c:858-863).
    result = run_sim(capsys, "-d", str(model), "-p", "x", "--frames", "2147483647", "-o", "")
    assert (result.code, result.err) == (
        1, "h3: generation requires at least one trained 22-frame decoder chunk\n")
    result = run_sim(capsys, "-d", str(model), "-p", "x", "--frames", "2147483630", "-o", "")
    assert (result.code, result.err) == (1, "h3: frames must align within the released 5..362 range\n")


def test_info_stdout_is_stdio_buffered_over_a_pipe(model: Path) -> None:
    # main.c never flushes stdout: with both streams on one pipe the --info block (fully
    # buffered) arrives at exit, after every unbuffered stderr progress line.
    process = subprocess.run([sim_program(), "-d", str(model), "--info", "-p", "x", "--width", "64",
                              "--height", "64", "--frames", "22", "--steps", "2", "-o", ""],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=60)
    text = process.stdout.decode()
    assert process.returncode == 0
    assert text.index("video VAE load") < text.index("h3-metal ") and text.endswith(" GiB\n")


def test_show_draws_kitty_graphics_on_stdout(model: Path, tmp_path: Path) -> None:
    # h3_terminal.c kitty_display: base64 RGB24 in 4096-char chunks, w/h scaled by --zoom,
    # one draw per denoise preview and per final frame (main.c cli_frame), on stdout.
    frames_dir = tmp_path / "frames"
    env = {**os.environ, "KITTY_WINDOW_ID": "1"}
    process = subprocess.run([sim_program(), "-d", str(model), "-p", "x", "--show", "--zoom", "3",
                              "--width", "64", "--height", "32", "--frames", "22", "--steps", "2",
                              "-o", "", "--frames-dir", str(frames_dir)],
                             capture_output=True, env=env, timeout=60)
    assert process.returncode == 0
    draws = process.stdout.decode("ascii").split("\n")
    assert draws[-1] == "" and len(draws) - 1 == 2 + 22
    head = "\033_Ga=T,f=24,t=d,s=64,v=32,w=192,h=96,m=1;"
    assert all(draw.startswith(head) for draw in draws[:-1])
    # The third draw is final frame 0: its pixels are the PPM written to --frames-dir.
    chunks = draws[2][len(head):].split("\033\\")
    assert chunks[-1] == "" and chunks[1].startswith("\033_Gm=0;")
    payload = chunks[0] + chunks[1][len("\033_Gm=0;"):]
    assert len(chunks[0]) == 4096
    import base64
    ppm = (frames_dir / "frame-0000.ppm").read_bytes()
    assert base64.b64decode(payload) == ppm[len(b"P6\n64 32\n255\n"):]
    assert b"h3: frame 1/22 via Kitty graphics\n" in process.stderr


def test_empty_anchor_path_is_still_an_anchor(capsys: pytest.CaptureFixture[str], model: Path) -> None:
    # main.c keeps optarg pointers; h3.c tests `params->first_frame` for NULL, not for "".
    result = run_sim(capsys, "-d", str(model), "-p", "x", "--last-frame", "", "--ref-image", "i.png")
    assert (result.code, result.err) == (1, "h3: full references cannot be combined with frame anchors\n")
    result = run_sim(capsys, "-d", str(model), "-p", "x", "--first-frame", "", "--width", "64",
                     "--height", "64", "-o", "")
    assert result.code == 1
    assert result.err.endswith("\nh3: invalid FFmpeg image input arguments\n")   # h3_ffmpeg.c:158-162
