"""h3-sim's validation against upstream: h3_load_dir, h3_valid_params, h3_generate's checks,
safetensors headers (h3_safetensors.c) and reference/anchor media failures (h3_ffmpeg.c)."""
from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import pytest

from sim_helpers import make_audio, make_image, make_model, make_video, run_sim

SMALL = ("--width", "64", "--height", "64", "--steps", "2", "-o", "")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("sim-validation") / "model")


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sim-media")
    return {
        "image": make_image(root / "red.png", "red"),
        "video": make_video(root / "clip.mp4", 3.0),
        "silent": make_video(root / "silent.mp4", 3.0, audio=False),
        "tiny_video": make_video(root / "tiny.mp4", 0.125, audio=False),
        "audio": make_audio(root / "tone.wav", 2.5),
        "short_audio": make_audio(root / "short.wav", 1.0),
        "long_audio": make_audio(root / "long.wav", 16.0),
        "eight": make_audio(root / "eight.wav", 8.0),
        "text": _write(root / "notes.txt", b"not media"),
    }


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _fail(capsys: pytest.CaptureFixture[str], model: Path, *args: str) -> str:
    """Run a generation expected to fail with exit 1; return h3's last message."""
    from sim_helpers import run_sim as run
    result = run(capsys, "-d", str(model), *args)
    assert result.code == 1, result.err
    last = result.err.splitlines()[-1]
    assert last.startswith("h3: ")
    return last[4:]


# h3_valid_params (h3.c:481-637), one case per rule, in upstream order.
VALID_PARAMS_CASES = [
    (("--width", "48"), "width and height must be multiples of 32 and at least 32"),
    (("--height", "0"), "width and height must be multiples of 32 and at least 32"),
    (("--width", "1376", "--height", "768"), "canvas exceeds the released 768*1344 pixel limit"),
    (("--render-width", "32"), "render width and height must be set together"),
    (("--render-width", "32", "--render-height", "64"),
     "internal render canvas must be same-aspect multiples of 32 no larger than the output canvas"),
    (("--render-width", "128", "--render-height", "128"),
     "internal render canvas must be same-aspect multiples of 32 no larger than the output canvas"),
    (("--frames", "4"), "frames must align within the released 5..362 range"),
    (("--frames", "363"), "frames must align within the released 5..362 range"),
    (("--steps", "1"), "denoising steps must be in [2, 1000]"),
    (("--steps", "1001"), "denoising steps must be in [2, 1000]"),
    (("--reuse", "0"), "denoise reuse must be in [1, 3]"),
    (("--reuse", "4"), "denoise reuse must be in [1, 3]"),
    (("--layers", "34"), "DiT layers must be in [35, 50]"),
    (("--layers", "51"), "DiT layers must be in [35, 50]"),
    (("--core-reuse", "0"), "core reuse must be in [1, 6]"),
    (("--core-reuse", "7"), "core reuse must be in [1, 6]"),
    (("--ssd-streaming", "--use-int8-row-fc2"),
     "SSD streaming uses original BF16 weights and cannot be combined with int8 row FC2"),
    (("--use-int8-row-fc2", "--use-slower-bf16-mlp"),
     "int8 row FC2 cannot be combined with the BF16 MLP"),
    (("--core-reuse", "4", "--reuse", "2"), "core reuse and denoiser reuse cannot be combined"),
    (("--ref-image", "a.png", "--first-frame", "b.png"),
     "full references cannot be combined with frame anchors"),
    (("--ref-image", ""), "reference 1 has no input path"),
    (("--ref-image", "a.png", "--ref-video-audio", "v.mp4", ""),
     "video+audio reference 2 has no soundtrack path"),
    (tuple(a for i in range(10) for a in ("--ref-image", f"{i}.png")),
     "Ref2VA limits are 9 images, 3 videos, and 3 audio inputs"),
    (tuple(a for i in range(4) for a in ("--ref-video", f"{i}.mp4")),
     "Ref2VA limits are 9 images, 3 videos, and 3 audio inputs"),
    (("--ref-image", "a.png", *(a for i in range(4) for a in ("--ref-audio", f"{i}.wav"))),
     "Ref2VA limits are 9 images, 3 videos, and 3 audio inputs"),
    (("--ref-audio", "a.wav"), "reference audio requires an image or video reference"),
]


@pytest.mark.parametrize("args,message", VALID_PARAMS_CASES)
def test_valid_params_rules(capsys: pytest.CaptureFixture[str], model: Path,
                            args: tuple[str, ...], message: str) -> None:
    assert _fail(capsys, model, "-p", "x", "--width", "64", "--height", "64", *args) == message


def test_empty_prompt_and_rule_order(capsys: pytest.CaptureFixture[str], model: Path) -> None:
    assert _fail(capsys, model, "-p", "", "--width", "48") == "prompt must not be empty"
    # h3_valid_params runs before the 22-frame chunk check (h3.c:856-865).
    assert _fail(capsys, model, "-p", "x", "--frames", "5", "--steps", "1") == \
        "denoising steps must be in [2, 1000]"
    # 5 is the only legal count below one 22-frame chunk (6..21 align up to 22).
    assert _fail(capsys, model, "-p", "x", *SMALL, "--frames", "5") == \
        "generation requires at least one trained 22-frame decoder chunk"
    # --seconds 0.9 = 22 frames: passes the chunk check and renders.
    result = run_sim(capsys, "-d", str(model), "-p", "x", *SMALL, "--seconds", "0.9")
    assert result.code == 0


def test_int8_row_fc2_depends_on_simulated_metal4(capsys: pytest.CaptureFixture[str], model: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3_SIM_METAL4", "0")
    assert _fail(capsys, model, "-p", "x", *SMALL, "--use-int8-row-fc2") == \
        "int8 row FC2 requires an M5-class Metal 4 GPU"
    monkeypatch.setenv("H3_SIM_METAL4", "1")
    assert run_sim(capsys, "-d", str(model), "-p", "x", *SMALL, "--frames", "22",
                   "--use-int8-row-fc2").code == 0


def test_references_need_ref2va_checkpoint(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                           media: dict[str, Path]) -> None:
    plain = make_model(tmp_path / "fl2va-only", ref2va=False)
    assert _fail(capsys, plain, "-p", "x", *SMALL, "--ref-image", str(media["image"])) == \
        "ordered references require the Ref2VA checkpoint"
    # ... and that check comes after the 22-frame one.
    assert _fail(capsys, plain, "-p", "x", *SMALL, "--frames", "5", "--ref-image", "a.png") == \
        "generation requires at least one trained 22-frame decoder chunk"


# ---------------------------------------------------------------- h3_load_dir

@pytest.fixture()
def scratch_model(tmp_path: Path, model: Path) -> Path:
    copy = tmp_path / "model"
    shutil.copytree(model, copy)
    return copy


def _load_error(capsys: pytest.CaptureFixture[str], model_dir: Path) -> str:
    result = run_sim(capsys, "-d", str(model_dir), "--info")
    assert result.code == 1 and result.out == ""
    return result.err


def test_load_dir_layout_errors(capsys: pytest.CaptureFixture[str], scratch_model: Path) -> None:
    root = scratch_model
    (root / "FL2VA/tokenizer/tokenizer.json").unlink()
    assert _load_error(capsys, root) == \
        f"h3: missing required model file: {root}/FL2VA/tokenizer/tokenizer.json\n"
    (root / "FL2VA/tokenizer/tokenizer.json").mkdir()       # a directory is not a regular file
    assert "missing required model file" in _load_error(capsys, root)
    (root / "FL2VA/tokenizer/tokenizer.json").rmdir()
    (root / "FL2VA/tokenizer/tokenizer.json").write_text("{}")
    shutil.rmtree(root / "FL2VA/audio_vae")
    assert _load_error(capsys, root) == f"h3: {root}/FL2VA/audio_vae: No such file or directory\n"
    (root / "FL2VA/audio_vae").mkdir()
    (root / "FL2VA/audio_vae/model.safetensors.index.json").write_text("{}")
    assert _load_error(capsys, root) == f"h3: {root}/FL2VA/audio_vae: no safetensors files\n"
    (root / "FL2VA/transformer/config.json").unlink()
    assert _load_error(capsys, root) == \
        f"h3: missing required model file: {root}/FL2VA/transformer/config.json\n"


def test_empty_model_dir_argument(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_sim(capsys, "-d", "", "--info")
    assert (result.code, result.err) == (1, "h3: model directory is required\n")


def test_no_metal_device(capsys: pytest.CaptureFixture[str], model: Path,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3_SIM_NO_METAL", "1")
    assert _load_error(capsys, model) == "h3: no Metal device available\n"


def test_ref2va_enabled_only_by_index(capsys: pytest.CaptureFixture[str], scratch_model: Path) -> None:
    (scratch_model / "Ref2VA/transformer/model.safetensors.index.json").unlink()
    result = run_sim(capsys, "-d", str(scratch_model), "--info")
    assert "  Ref2VA DiT          0 files     0 tensors    0.000 GiB" in result.out.splitlines()


def _shard(header: object, data: bytes = b"", *, raw_header: bytes | None = None) -> bytes:
    encoded = raw_header if raw_header is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(encoded)) + encoded + data


HEADER_CASES = [
    (b"\x01\x02", "{path}: invalid file"),
    (struct.pack("<Q", 100) + b"{}", "{path}: invalid header size"),
    (struct.pack("<Q", 256 * 1024 * 1024 + 1) + b"{}", "{path}: invalid header size"),
    (_shard(None, raw_header=b"[]"), "malformed safetensors JSON header"),
    (_shard(None, raw_header=b'{"a":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}}', data=b"\0"),
     "incomplete tensor descriptor"),
    (_shard({"a": {"dtype": "F32", "shape": [1] * 9, "data_offsets": [0, 4]}}, b"\0" * 4),
     "tensor rank exceeds 8"),
    (_shard({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4),
     "tensor data offsets exceed file"),
    (_shard({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4),
     "tensor shape does not match byte offsets"),
    (_shard(None, raw_header=b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} x', data=b"\0" * 4),
     "trailing data in safetensors header"),
    (_shard(None, raw_header=b'{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}', data=b"\0" * 4),
     "expected unsigned JSON integer"),
    (_shard(None, raw_header=b'{"a\x01":{}}'), "malformed JSON string escape"),
]


@pytest.mark.parametrize("content,template", HEADER_CASES)
def test_safetensors_header_errors(capsys: pytest.CaptureFixture[str], scratch_model: Path,
                                   content: bytes, template: str) -> None:
    shard = scratch_model / "FL2VA/audio_vae/zz-broken.safetensors"
    shard.write_bytes(content)
    assert _load_error(capsys, scratch_model) == "h3: " + template.format(path=shard) + "\n"


def test_safetensors_leniency_matches_upstream(capsys: pytest.CaptureFixture[str],
                                               scratch_model: Path) -> None:
    # Unaligned data, lax metadata scalars and an unknown key all pass h3's reader.
    header = (b'{"__metadata__":{"format":nonsense},"t":{"dtype":"BF16","shape":[3],'
              b'"data_offsets":[0,6],"extra":[1,{"k":true}]}}')
    (scratch_model / "FL2VA/audio_vae/lenient.safetensors").write_bytes(
        _shard(None, raw_header=header, data=b"\0" * 6))
    result = run_sim(capsys, "-d", str(scratch_model), "--info")
    assert result.code == 0 and "audio VAE" in result.out


def test_appledouble_passes_info_but_fails_when_weights_open(
        capsys: pytest.CaptureFixture[str], scratch_model: Path) -> None:
    # The inventory skips dotfiles; h3_weight_store_open does not (h3_weights.c:56-57).
    ghost = scratch_model / "FL2VA/transformer/._model-00001-of-00007.safetensors"
    ghost.write_bytes(b"\x00\x05\x16\x07" + b"\x00" * 60)
    info = run_sim(capsys, "-d", str(scratch_model), "--info")
    assert info.code == 0
    result = run_sim(capsys, "-d", str(scratch_model), "-p", "x", *SMALL, "--frames", "22")
    assert result.code == 1
    assert result.err.endswith(f"\rtext encoder                50/50  \n"
                               f"h3: {ghost}: invalid header size\n")


def test_missing_vae_config_reported_by_stage(capsys: pytest.CaptureFixture[str],
                                              scratch_model: Path) -> None:
    (scratch_model / "FL2VA/audio_vae/config.json").unlink()
    message = _fail(capsys, scratch_model, "-p", "x", *SMALL, "--frames", "22")
    assert message == (f"cannot open audio VAE config {scratch_model}/FL2VA/audio_vae/config.json: "
                       "No such file or directory")


# ---------------------------------------------------------------- media (h3_ffmpeg.c)

def test_anchor_and_reference_media_failures(capsys: pytest.CaptureFixture[str], model: Path,
                                             media: dict[str, Path], tmp_path: Path) -> None:
    missing = tmp_path / "missing.png"
    message = _fail(capsys, model, "-p", "x", *SMALL, "--frames", "22", "--first-frame", str(missing))
    assert re.fullmatch(rf"FFmpeg could not decode image {re.escape(str(missing))} \(status \d+\)",
                        message)
    assert _fail(capsys, model, "-p", "x", *SMALL, "--ref-image", str(media["text"])) == \
        f"FFprobe could not inspect visual stream {media['text']}"
    assert _fail(capsys, model, "-p", "x", *SMALL, "--ref-silent-video", str(media["tiny_video"])) == \
        "reference videos require at least 5 decoded frames"


@pytest.mark.parametrize("case,message", [
    ("short", "reference audio requires at least 2 seconds at 32 kHz"),
    ("long", "reference audio exceeds the 15 second total limit"),
    ("total", "ordered reference audio exceeds 15 seconds in total"),
    ("soundtrack", "video soundtrack 1 requires at least 2 seconds; request at least 56 output frames"),
])
def test_reference_audio_limits(capsys: pytest.CaptureFixture[str], model: Path,
                                media: dict[str, Path], case: str, message: str) -> None:
    image = ("--ref-image", str(media["image"]))
    args = {
        "short": (*image, "--ref-audio", str(media["short_audio"])),
        "long": (*image, "--ref-audio", str(media["long_audio"])),
        "total": (*image, "--ref-audio", str(media["eight"]), "--ref-audio", str(media["eight"])),
        "soundtrack": ("--ref-video", str(media["video"]), "--frames", "39"),
    }[case]
    assert _fail(capsys, model, "-p", "x", *SMALL, *args) == message


def test_missing_ffmpeg_and_ffprobe_programs(capsys: pytest.CaptureFixture[str], model: Path,
                                             media: dict[str, Path], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3_FFMPEG", str(tmp_path / "no-ffmpeg"))
    message = _fail(capsys, model, "-p", "x", "--width", "64", "--height", "64", "--steps", "2",
                    "--frames", "22", "-o", str(tmp_path / "out.mp4"))
    assert message == "cannot start FFmpeg: No such file or directory"
    monkeypatch.delenv("H3_FFMPEG")
    monkeypatch.setenv("H3_FFPROBE", str(tmp_path / "no-ffprobe"))
    assert _fail(capsys, model, "-p", "x", *SMALL, "--ref-image", str(media["image"])) == \
        "cannot start FFprobe: No such file or directory"


def test_output_parent_that_cannot_be_created(capsys: pytest.CaptureFixture[str], model: Path,
                                              tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    message = _fail(capsys, model, "-p", "x", "--width", "64", "--height", "64", "--steps", "2",
                    "--frames", "22", "-o", str(blocker / "sub" / "out.mp4"))
    assert message == f"cannot create output directory {blocker}/sub: Not a directory"


def test_prompt_must_be_utf8(capsys: pytest.CaptureFixture[str], model: Path,
                             media: dict[str, Path]) -> None:
    invalid = b"caf\xe9".decode("utf-8", "surrogateescape")   # how Python receives such argv
    run = run_sim(capsys, "-d", str(model), "-p", invalid, *SMALL, "--frames", "22")
    assert run.code == 1
    assert run.err.endswith("\rtokenizer                    1/1   \nh3: prompt is not valid UTF-8\n")
    anchored = run_sim(capsys, "-d", str(model), "-p", invalid, *SMALL, "--frames", "22",
                       "--first-frame", str(media["image"]))
    assert anchored.err.endswith("\rtext encoder                 0/50  \n"
                                 "h3: prompt is not valid UTF-8\n")


# Rules of h3_valid_params that main.c's parser can never trigger, reached through the engine API
# that the interactive session (and any in-process caller) uses.
@pytest.mark.parametrize("changes,message", [
    ({"token_reduction": 2}, "token reduction must be zero or one"),
    ({"use_int8_row_fc2": 2}, "int8 row FC2 must be zero or one"),
    ({"use_reference_rope": 2}, "reference RoPE must be zero or one"),
    ({"ssd_streaming": 2}, "SSD streaming must be zero or one"),
    ({"preview_denoise": 2}, "denoising preview must be zero or one"),
    ({"reference_image_size": 2}, "unknown reference image sizing policy"),
    ({"references": [None] * 13}, "Ref2VA supports at most 12 references"),
])
def test_engine_only_rules(model: Path, changes: dict[str, object], message: str) -> None:
    from h3bridge.sim.engine import SimContext, SimError, generate
    from h3bridge.sim.params import SimParams
    params = SimParams(width=64, height=64, frames=22, steps=2)
    for name, value in changes.items():
        setattr(params, name, value)
    with pytest.raises(SimError) as caught:
        generate(SimContext.load_dir(str(model)), "x", params, on_frame=lambda frame: False)
    assert caught.value.message == message


def test_unknown_reference_kind(model: Path) -> None:
    from h3bridge.sim.engine import SimContext, SimError, generate
    from h3bridge.sim.params import SimParams, SimReference
    params = SimParams(width=64, height=64, frames=22,
                       references=[SimReference(7, "a.png")])   # type: ignore[arg-type]
    with pytest.raises(SimError, match="^reference 1 has an unknown type$"):
        generate(SimContext.load_dir(str(model)), "x", params)


def test_info_comes_before_parameter_validation(capsys: pytest.CaptureFixture[str],
                                                model: Path) -> None:
    run = run_sim(capsys, "-d", str(model), "--info", "-p", "x", "--width", "48")
    assert run.out.startswith("h3-metal 0.1.0-dev\n") and run.code == 1
    assert run.err == "h3: width and height must be multiples of 32 and at least 32\n"


def test_reference_soundtrack_decode_failures(capsys: pytest.CaptureFixture[str], model: Path,
                                              media: dict[str, Path], tmp_path: Path) -> None:
    # --ref-video keeps the embedded soundtrack; a silent file has none (-map 0:a:0 fails).
    assert _fail(capsys, model, "-p", "x", *SMALL, "--frames", "56",
                 "--ref-video", str(media["silent"])) == \
        f"FFmpeg could not decode a stereo soundtrack from {media['silent']}"
    missing = tmp_path / "missing.wav"
    assert _fail(capsys, model, "-p", "x", *SMALL, "--frames", "56",
                 "--ref-video-audio", str(media["silent"]), str(missing)) == \
        f"FFmpeg could not decode a stereo soundtrack from {missing}"
    # --ref-silent-video drops it and renders.
    assert run_sim(capsys, "-d", str(model), "-p", "x", *SMALL, "--frames", "22",
                   "--ref-silent-video", str(media["silent"])).code == 0


def test_llround_rounds_half_away_without_the_add_half_trap() -> None:
    # C llround (main.c:87, h3_cli.c:566, h3.c:1130): 0.49999999999999994 + 0.5 rounds up to
    # 1.0 in double arithmetic, but llround gives 0.
    from h3bridge.sim.params import c_llround
    assert [c_llround(x) for x in (0.49999999999999994, 0.5, 2.5, -2.5, 55.5, 4503599627370497.0)] == [
        0, 1, 3, -3, 56, 4503599627370497]


def test_os_errors_are_worded_like_macos_strerror() -> None:
    # Apple Libc gen/errlst.c texts where glibc's differ; the common ones are the same.
    import errno
    from h3bridge.sim.libc import strerror
    assert strerror(errno.EDQUOT) == "Disc quota exceeded"
    assert strerror(errno.EXDEV) == "Cross-device link"
    assert strerror(errno.ETIMEDOUT) == "Operation timed out"
    assert strerror(errno.ENOENT) == "No such file or directory"
    assert strerror(errno.ENOTDIR) == "Not a directory"
    assert strerror(0) == "Undefined error: 0"
    assert strerror(4242) == "Unknown error: 4242"


@pytest.mark.parametrize("change,message", [
    (lambda d: d["normalizer"].update(type="NFKC"), "unexpected tokenizer specification"),
    (lambda d: d["model"].pop("unk_token"), "unexpected tokenizer specification"),
    (lambda d: d["model"].update(merges=["nospace"]), "invalid tokenizer merge"),
    (lambda d: d["added_tokens"][0].update(lstrip=True), "unsupported added-token policy"),
])
def test_tokenizer_specification_errors(capsys: pytest.CaptureFixture[str], scratch_model: Path,
                                        change: object, message: str) -> None:
    # h3_tokenizer_load (h3_tokenizer.m:313-375) runs between "tokenizer" 0/1 and 1/1.
    path = scratch_model / "FL2VA/tokenizer/tokenizer.json"
    data = json.loads(path.read_text())
    change(data)   # type: ignore[operator]
    path.write_text(json.dumps(data))
    result = run_sim(capsys, "-d", str(scratch_model), "-p", "x", *SMALL)
    assert (result.code, result.err) == (1, f"\rtokenizer                    0/1   \nh3: {message}\n")


@pytest.mark.parametrize("part,edit,message", [
    ("audio_vae", lambda d: d.pop("latents_std"), "audio VAE config is missing latents_std"),
    ("audio_vae", lambda d: d["latents_mean"].pop(), "audio VAE config has short latents_mean"),
    ("audio_vae", lambda d: d["latents_mean"].append(0.0), "audio VAE config has long latents_mean"),
    ("audio_vae", lambda d: d["latents_std"].__setitem__(3, 0.0),
     "audio VAE latent standard deviation is invalid"),
    ("audio_vae", lambda d: d["latents_mean"].__setitem__(0, 1e39),     # strtof overflow: ERANGE
     "audio VAE config has malformed latents_mean"),
    ("video_vae", lambda d: d["latents_std"].__setitem__(0, -1.0),
     "video VAE latent standard deviation is invalid"),
])
def test_vae_config_normalization_arrays(capsys: pytest.CaptureFixture[str], scratch_model: Path,
                                         part: str, edit: object, message: str) -> None:
    # parse_float_array + the std > 0 check (h3_audio_vae.c:262-348, h3_video_vae.c:232-318).
    path = scratch_model / "FL2VA" / part / "config.json"
    data = json.loads(path.read_text())
    edit(data)   # type: ignore[operator]
    path.write_text(json.dumps(data))
    assert _fail(capsys, scratch_model, "-p", "x", *SMALL, "--frames", "22") == message


def test_video_encoder_words_its_deviation_check_differently(
        capsys: pytest.CaptureFixture[str], scratch_model: Path, tmp_path: Path) -> None:
    # h3_video_encoder.c:278-282 says "deviation", the decoder "standard deviation".
    path = scratch_model / "FL2VA/video_vae/config.json"
    data = json.loads(path.read_text())
    data["latents_std"][5] = 0.0
    path.write_text(json.dumps(data))
    image = make_image(tmp_path / "first.png", "red")
    message = _fail(capsys, scratch_model, "-p", "x", *SMALL, "--frames", "22", "--first-frame", str(image))
    assert message == "video VAE latent deviation is invalid"
