"""h3-sim's interactive mode (h3bridge/sim/interactive.py) mirrors upstream h3_cli.c over pipes."""
from __future__ import annotations

import os
import re
import select
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from core_helpers import make_image, model_dir, sim_engine_path  # noqa: F401  (fixture)

OUTPUTS = re.compile(r"^Outputs: (/tmp/h3-[A-Za-z0-9]{6})$", re.M)

# Upstream never removes its mkdtemp session directory (h3bridge's SessionEngine does); the sims
# these tests run directly leave theirs, named on the banner's `Outputs:` line, for the test to remove.
_session_dirs: list[str] = []


def note_session_dir(stdout: str | bytes) -> None:
    text = stdout.decode("utf-8", "replace") if isinstance(stdout, bytes) else stdout
    _session_dirs.extend(OUTPUTS.findall(text))


@pytest.fixture(autouse=True)
def _remove_session_dirs():
    yield
    while _session_dirs:
        shutil.rmtree(_session_dirs.pop(), ignore_errors=True)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


def run_interactive(model: Path, home: Path, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home)}
    for variable in ("KITTY_WINDOW_ID", "GHOSTTY_RESOURCES_DIR", "TERM_PROGRAM", "ITERM_SESSION_ID",
                     "WEZTERM_PANE", "KONSOLE_VERSION"):
        env.pop(variable, None)
    done = subprocess.run([str(sim_engine_path()), "-d", str(model), *args], input=script, text=True,
                          capture_output=True, env=env, timeout=60)
    note_session_dir(done.stdout)
    return done


def status_block(output_dir: str, *, seed: str = "random") -> list[str]:
    """h3_cli.c print_status with upstream defaults (H3_PARAMS_DEFAULT)."""
    return ["Size: 864x480",
            "Frames: 56 requested, 56 generated (2.33 seconds)",
            "Steps: 20 | reuse: 1 | layers: 50 | core reuse: 1 | tokens: full | weights: resident | FC2: int8 grouped",
            "Spatial RoPE: native 256 adapted",
            f"Seed: {seed}", "First: none", "Last: none", "References: 0",
            f"Show: off | open: off | output: {output_dir}"]


def test_banner_status_and_goodbye_at_eof(model_dir: Path, home: Path) -> None:  # noqa: F811
    done = run_interactive(model_dir, home, "")
    assert done.returncode == 0 and done.stderr == ""
    output_dir = OUTPUTS.search(done.stdout)[1]
    assert done.stdout.splitlines() == [
        "H3 Interactive Mode", f"Model: {model_dir}", f"Outputs: {output_dir}",
        "Type a prompt to generate video; !help lists commands.", *status_block(output_dir), "Goodbye."]
    # mkdtemp: a fresh private directory per session.
    assert stat.S_IMODE(os.stat(output_dir).st_mode) == 0o700
    assert "h3> " not in done.stdout        # no prompt when stdin is not a TTY (linenoiseNoTTY)


def test_seed_given_on_the_command_line_is_kept_and_show_without_terminal(model_dir: Path, home: Path) -> None:  # noqa: F811
    done = run_interactive(model_dir, home, "!seed\n", "--seed", "9", "--show", "-o", "ignored.mp4")
    lines = done.stdout.splitlines()
    assert "Display unavailable in this terminal." in lines
    assert lines.count("Seed: 9") == 2       # status, then `!seed`


def test_every_command_replies_like_upstream(model_dir: Path, home: Path, tmp_path: Path) -> None:  # noqa: F811
    image = make_image(tmp_path / "anchor.png")
    plain_file = tmp_path / "plain.txt"
    plain_file.write_text("x")
    new_output = tmp_path / "new outputs"
    script = "\n".join([
        "!HELP", "!seed", "!seed 12", "!seed -1", "!seed abc", "!seed -5", "!seed 18446744073709551616",
        "!size", "!size 512X288", "!size 512 x 288", "!size 512x 288", "!size 0x5",
        "!render-size", "!render-size 256x144", "!render-size NATIVE", "!render-size foo",
        "!frames", "!frames 40", "!frames 0", "!seconds", "!seconds 1.5", "!seconds 0", "!seconds inf",
        "!seconds 0x1p1", "!steps 1001", "!reuse 33", "!layers 34", "!layers 45", "!core-reuse 7",
        "!token-reduction", "!token-reduction maybe",
        "!int8-row-fc2 on", "!ssd-streaming on", "!int8-row-fc2 off", "!ssd-streaming ON", "!int8-row-fc2 1",
        "!reference-rope 1",
        "!first", "!first /nonexistent.png", f"!first {image}", f"!ref-image {image}", "!first clear",
        "!ref-image", f"!ref-image {image}", f"!last {image}", "!refs", "!ref-remove 2", "!ref-remove 1",
        "!refs bogus", "!refs clear",
        "!show", "!show off", "!zoom 0", "!zoom 3", "!open", "!open off",
        f"!output {plain_file}", f"!output {new_output}",
        "!save", "!again", "!cache", "!cache clear", "!cache foo", "!", "   ", "!nope",
        "!status", "!quit", "!status",
    ]) + "\n"
    done = run_interactive(model_dir, home, script)
    assert done.returncode == 0
    output_dir = OUTPUTS.search(done.stdout)[1]
    out = done.stdout.splitlines()
    help_start = out.index("Commands:")
    help_end = out.index("Type a prompt on a line by itself to generate a video.")
    assert out[help_start + 1] == "  !help                    Show this help"
    assert out[help_end - 2:help_end] == ["  !quit                    Exit", ""]
    assert help_end - help_start == 31      # h3_cli.c print_help: 29 commands, a blank line
    assert out[help_end + 1:] == [
        "Seed: random", "Seed: 12", "Seed: random", "Seed: 18446744073709551611",
        "Size: 864x480", "Size: 512x288", "Size: 512x288",
        "Render size: native", "Render size: 256x144", "Render size: native",
        "Frames: 56", "Frames: 40", "Seconds: 2.33 (56 aligned frames)", "Seconds: 1.5 (39 aligned frames)",
        "Seconds: 2 (56 aligned frames)", "Layers: 45",
        "Token reduction: on",
        "FC2 int8 row scaling: on", "FC2 int8 row scaling: off", "SSD streaming: on",
        "Reference spatial RoPE: on",
        "First: none", f"First: {image}", "First: none",
        f"Added reference 1 as <Picture 1>: {image}",
        "Ordered references:", f"  1. image       <Picture 1> {image}",
        "Removed reference 1.", "References: none", "References: none",
        "Show: off", "Zoom: 3x", "Open: on", "Open: off",
        f"Output: {new_output}",
        "Cache: embeddings 0 (0.0 MiB), DiT empty, video VAE empty", "Cache cleared.",
        "Size: 512x288",
        "Frames: 48 requested, 56 generated (2.33 seconds)",
        "Steps: 20 | reuse: 1 | layers: 45 | core reuse: 1 | tokens: reduced | weights: SSD BF16 | FC2: BF16",
        "Spatial RoPE: released reference", "Seed: 18446744073709551611", "First: none", "Last: none",
        "References: 0", f"Show: off | open: off | output: {new_output}", "Goodbye."]
    assert new_output.is_dir() and output_dir != str(new_output)
    # FFprobe's own complaint about the missing file also reaches stderr (its stderr is inherited).
    assert any(line.startswith("/nonexistent.png: ") for line in done.stderr.splitlines())
    assert [line for line in done.stderr.splitlines() if not line.startswith("/nonexistent.png:")] == [
        "h3: invalid seed", "h3: invalid seed", "h3: size must be WxH", "h3: size must be WxH",
        "h3: render size must be WxH or native", "h3: invalid Frames", "h3: invalid duration",
        "h3: invalid duration", "h3: invalid Steps", "h3: invalid Reuse", "h3: invalid Layers",
        "h3: invalid Core reuse", "h3: use on or off",
        "h3: disable !int8-row-fc2 before SSD streaming", "h3: disable !ssd-streaming before int8 row FC2",
        "h3: FFprobe could not inspect visual stream /nonexistent.png",
        "h3: Ref2VA references cannot be combined with frame anchors",
        "Usage: !ref-image PATH", "h3: frame anchors cannot be combined with Ref2VA references",
        "Usage: !ref-remove N (see !refs)", "h3: use !refs or !refs clear",
        "h3: no supported graphical terminal detected", "h3: invalid zoom",
        f"h3: cannot use output directory {plain_file}: File exists",
        "h3: no video to save", "h3: no previous prompt", "h3: use !cache or !cache clear",
        "h3: unknown command; type !help", "h3: unknown command; type !help"]
    # Every non-blank line went into the history, up to and including !quit (linenoise.c, h3_cli.c:767).
    history = (home / ".h3_history").read_text().splitlines()
    assert history[0] == "!HELP" and history[-1] == "!quit" and "   " not in history
    assert stat.S_IMODE((home / ".h3_history").stat().st_mode) == 0o600


def test_generations_number_outputs_and_failures_use_up_a_number(model_dir: Path, home: Path,  # noqa: F811
                                                                 tmp_path: Path) -> None:
    saved = tmp_path / "saved.mp4"
    script = "\n".join(["!size 96x64", "!frames 22", "!steps 2", "a red fox", "!steps 1", "a red fox",
                        "!steps 2", "!again", "!cache", f"!save {saved}"]) + "\n"
    done = run_interactive(model_dir, home, script, "--seed", "5", "--frames-dir", str(tmp_path / "frames"))
    assert done.returncode == 0, done.stderr
    output_dir = OUTPUTS.search(done.stdout)[1]
    out = done.stdout.splitlines()
    generated = out[out.index("Steps: 2") + 1:]
    assert generated[0] == "Seed: 5"
    assert re.fullmatch(rf"Done -> {output_dir}/video-0001\.mp4 \[\d+\.\d\ds\]", generated[1])
    assert generated[2:5] == ["Steps: 1", "Seed: 5", "Steps: 2"]          # the failed run printed no Done
    assert generated[5] == "Seed: 5"
    assert re.fullmatch(rf"Done -> {output_dir}/video-0003\.mp4 \[\d+\.\d\ds\]", generated[6])
    assert re.fullmatch(r"Cache: embeddings 1 \(\d+\.\d MiB\), DiT resident, video VAE resident", generated[7])
    assert generated[8:] == [f"Saved: {saved}", "Goodbye."]
    assert sorted(os.listdir(output_dir)) == ["video-0001.mp4", "video-0003.mp4"]
    assert saved.read_bytes() == Path(output_dir, "video-0003.mp4").read_bytes()
    assert "h3: denoising steps must be in [2, 1000]" in done.stderr.splitlines()
    # The repeat of the same prompt and shape hit upstream's caches (h3.c h3_generate).
    third = done.stderr.split("h3: denoising steps must be in [2, 1000]")[1]
    assert "h3: conditioning cache hit" in third and "h3: prepared DiT cache hit" in third
    # --frames-dir is created (main.c) but interactive mode writes no frames; -o is not used either.
    assert (tmp_path / "frames").is_dir() and not os.listdir(tmp_path / "frames")


def test_random_seed_by_default_and_unterminated_last_line(model_dir: Path, home: Path) -> None:  # noqa: F811
    done = run_interactive(model_dir, home, "!size 96x64\r\n!frames 22\n!steps 2\na red fox")
    seeds = re.findall(r"^Seed: (\d+)$", done.stdout, re.M)
    assert len(seeds) == 1 and 0 <= int(seeds[0]) < 2**64        # arc4random_buf: any 64-bit value
    assert re.search(r"^Done -> /tmp/h3-\w{6}/video-0001\.mp4", done.stdout, re.M)


def test_history_loads_the_newest_100_lines_then_keeps_500(model_dir: Path, home: Path) -> None:  # noqa: F811
    (home / ".h3_history").write_text("".join(f"old {index}\n" for index in range(150)))
    run_interactive(model_dir, home, "!status\n!status\n!seed\n")
    history = (home / ".h3_history").read_text().splitlines()
    assert history == [f"old {index}" for index in range(50, 150)] + ["!status", "!seed"]


def test_stdout_is_block_buffered_over_a_pipe(model_dir: Path, home: Path) -> None:  # noqa: F811
    """Upstream flushes stdout only after `Seed:` (h3_cli.c generate); a driver must cope."""
    env = {**os.environ, "HOME": str(home)}
    process = subprocess.Popen([str(sim_engine_path()), "-d", str(model_dir)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        assert process.stdin is not None and process.stdout is not None and process.stderr is not None
        process.stdin.write(b"!size 96x64\n!frames 22\n!steps 2\n!bogus\n")
        process.stdin.flush()
        err = b""
        while b"unknown command" not in err:
            err += os.read(process.stderr.fileno(), 4096)
        # All four commands ran, yet none of their replies (nor the banner) left the buffer.
        ready, _, _ = select.select([process.stdout], [], [], 0.3)
        assert ready == []
        process.stdin.write(b"a red fox\n")
        process.stdin.flush()
        out = b""
        while b"Seed: " not in out:
            out += os.read(process.stdout.fileno(), 65536)
        note_session_dir(out)
        assert b"H3 Interactive Mode" in out and b"Steps: 2" in out and b"Done ->" not in out
        process.stdin.close()          # EOF ends the session; exit flushes the rest
        rest = process.stdout.read()
        assert b"Done -> " in rest and rest.endswith(b"Goodbye.\n")
        assert process.wait(30) == 0
    finally:
        process.kill()


def test_number_edge_cases_follow_macos_libc(model_dir: Path, home: Path) -> None:  # noqa: F811
    # h3_cli.c:58-77 and :550-569 use strtol/strtoull/strtod: only ASCII digits count, and
    # macOS strtod sets ERANGE when a non-zero decimal comes out subnormal (Apple Libc
    # tests/strtod.c strtod_verify) but not for an exact subnormal hex float.
    script = "\n".join(["!frames \u0663", "!seed \u0663", "!size \u0663x3", "!seconds 1e-320",
                        "!seconds 0x1p-1074", "!frames 2147483647", "!status"]) + "\n"
    done = run_interactive(model_dir, home, script)
    assert done.stderr.splitlines() == ["h3: invalid Frames", "h3: invalid seed", "h3: size must be WxH",
                                        "h3: invalid duration"]
    lines = done.stdout.splitlines()
    assert "Seconds: 4.94e-324 (5 aligned frames)" in lines      # llround(24 * 2^-1074) = 0
    # h3_align_frame_count's int round-up wraps near INT32_MAX (h3_host.c:15-21).
    assert "Frames: 2147483647 requested, -2147483635 generated (-8.95e+07 seconds)" in lines


def test_show_draws_previews_and_final_frames_with_zoom(model_dir: Path, home: Path) -> None:  # noqa: F811
    # h3_cli.c cli_frame: once !show is on it gets every preview ("h3: preview i/N" first) and
    # every final frame, and h3_terminal_display_rgb24 draws each on stdout (Kitty here).
    env = {**os.environ, "HOME": str(home), "KITTY_WINDOW_ID": "1"}
    script = "!size 64x32\n!frames 22\n!steps 2\n!zoom 1\n!show on\na red fox\n"
    done = subprocess.run([str(sim_engine_path()), "-d", str(model_dir)], input=script.encode(),
                          capture_output=True, env=env, timeout=60)
    note_session_dir(done.stdout)
    assert done.returncode == 0
    out = done.stdout.decode("ascii")
    assert "Zoom: 1x\nShow: on\n" in out and "\nDone -> " in out
    assert out.count("\033_Ga=T,f=24,t=d,s=64,v=32,w=64,h=32,m=1;") == 2 + 22
    assert [line for line in done.stderr.decode().split("\n") if line.startswith("h3:")] == [
        "h3: conditioning cache miss; stored exact BF16", "h3: prepared DiT cache miss; model retained",
        "h3: video VAE cache miss; decoder retained", "h3: preview 1/2", "h3: preview 2/2"]


def test_command_names_fold_ascii_only_like_strcasecmp(model_dir: Path, home: Path) -> None:  # noqa: F811
    # "\u212a" (KELVIN SIGN) lowercases to "k" in Python but not in strcasecmp (h3_cli.c:485-686).
    done = run_interactive(model_dir, home, "!to\u212aen-reduction\n!TOKEN-Reduction ON\n!Refs CLEAR\n")
    assert done.stderr == "h3: unknown command; type !help\n"
    assert "Token reduction: on\nReferences: none\n" in done.stdout


def test_save_destination_is_cut_to_the_path_buffer(model_dir: Path, home: Path) -> None:  # noqa: F811
    # snprintf(destination, 4096, "%s", argument) (h3_cli.c:662-664): 4095 bytes survive.
    long_name = "a" * 5000
    done = run_interactive(model_dir, home, f"a fox\n!save {long_name}\n", "--width", "64", "--height", "64",
                           "--frames", "22", "--steps", "2")
    assert done.stderr.endswith(f"h3: cannot save {long_name[:4095]}: File name too long\n")
