"""`h3bridge build-engine` and upstream h3.c's own code running here over the portable backend
(h3bridge/engine_build): the build command, `h3 --info`, the device probe, the tokenizer against
Hugging Face's, the fault variables, and the two engines the issue asks for (a one-shot render,
the library engine with previews and a cancel). Skipped without H3_UPSTREAM_SOURCE."""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from core_helpers import fast_request
from h3bridge import CancelToken, EngineCrashedError, EngineError, GenerationCancelled, LibraryEngine, OneShotEngine
from h3bridge.cli.main import main as h3bridge_main
from h3bridge.engine_build.build import LIBRARY_NAME, PROGRAM_NAME, read_source, _makefile_list
from h3bridge.errors import EngineNotFoundError
from upstream_helpers import UPSTREAM_SOURCE_ENV, realistic_model, upstream_engine  # noqa: F401 (fixtures)

T2VA_PHASES = ["tokenizer", "text encoder", "refine text", "precompute AdaLN", "load transformer core",
               "denoise enqueue", "denoise", "audio VAE", "video VAE load", "FFmpeg"]


def _phases(events) -> list[str]:
    phases: list[str] = []
    for event in events:
        if not phases or phases[-1] != event.phase:
            phases.append(event.phase)
    return phases


def _run_h3(program: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    merged = dict(os.environ)
    merged.update(env or {})
    done = subprocess.run([str(program), *args], cwd=str(program.parent), capture_output=True, env=merged,
                          timeout=300)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


# ----------------------------------------------------------------------------- the build command

def test_makefile_lists_are_read_with_continuations_and_appends() -> None:
    text = "LIB_C := a.c b.c \\\n\tc.c\n\nLIB_C += d.c\nCLI_OBJ := main.o x.o\n"
    assert _makefile_list(text, "LIB_C") == ["a.c", "b.c", "c.c", "d.c"]
    assert _makefile_list(text, "CLI_OBJ") == ["main.o", "x.o"]


def test_a_folder_that_is_not_h3c_is_refused_naming_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "h3.h").write_text("")
    with pytest.raises(EngineNotFoundError) as caught:
        read_source(tmp_path)
    assert "Makefile" in caught.value.message and "h3_gpu.h" in caught.value.message
    assert "antirez/h3.c" in caught.value.hint


def test_build_engine_prints_the_program_and_library_last_and_caches(upstream_engine, capsys,  # noqa: F811
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from h3bridge.userdirs import CACHE_ENV, platform_cache_dir
    monkeypatch.setenv(CACHE_ENV, str(platform_cache_dir()))      # where the session's build is cached
    source = os.environ[UPSTREAM_SOURCE_ENV]
    assert h3bridge_main(["build-engine", source]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2:] == [str(upstream_engine.program), str(upstream_engine.library)]
    assert h3bridge_main(["build-engine", source, "--json"]) == 0
    built = json.loads(capsys.readouterr().out)
    assert built["program"] == str(upstream_engine.program) and built["cached"] is True
    assert built["backend"] == "portable"
    folder = upstream_engine.program.parent
    assert {PROGRAM_NAME, LIBRARY_NAME, "h3_shaders.metal", "engine.json"} <= {p.name for p in folder.iterdir()}
    assert not [p for p in folder.parent.iterdir() if p.name.endswith(".tmp")]   # no half-built folder left


# ----------------------------------------------------------------------------- upstream's CLI here

def test_info_reports_the_configured_device(upstream_engine, realistic_model: Path) -> None:  # noqa: F811
    done = _run_h3(upstream_engine.program, "--info", "-d", str(realistic_model),
                   env={"H3_SIM_DEVICE_NAME": "Apple M2 Ultra", "H3_SIM_PHYSICAL_MEMORY": "64G"})
    assert done.returncode == 0, done.stderr
    assert "Device: Apple M2 Ultra" in done.stdout and "physical memory       64.0 GiB" in done.stdout
    assert "FL2VA DiT" in done.stdout and "Ref2VA DiT" in done.stdout


def test_no_metal_device_is_upstreams_load_failure(upstream_engine, realistic_model: Path) -> None:  # noqa: F811
    done = _run_h3(upstream_engine.program, "--info", "-d", str(realistic_model), env={"H3_SIM_NO_METAL": "1"})
    assert done.returncode == 1 and "no Metal device available" in done.stderr


def test_h3_away_from_its_shaders_fails_as_on_a_mac(upstream_engine, realistic_model: Path,  # noqa: F811
                                                    tmp_path: Path) -> None:
    done = subprocess.run([str(upstream_engine.program), "-d", str(realistic_model), "-p", "x", "--width", "64",
                           "--height", "64", "--frames", "22", "--steps", "2", "-o", str(tmp_path / "x.mp4")],
                          cwd=str(tmp_path), capture_output=True, timeout=300)
    assert done.returncode == 1 and b"cannot compile h3_shaders.metal" in done.stderr
    assert not (tmp_path / "x.mp4").exists()


@pytest.mark.parametrize("device, enqueue", [("Apple M5 Max", True), ("Apple M1 Ultra", False)])
def test_the_m5_path_is_upstreams_choice_from_the_device_name(upstream_engine, realistic_model: Path,  # noqa: F811
                                                             tmp_path: Path, device: str, enqueue: bool) -> None:
    """Upstream's GPU sampler ("denoise enqueue", then "denoise") runs on an M5 only (h3_gpu_is_m5)."""
    from sim_helpers import progress_records
    done = _run_h3(upstream_engine.program, "-d", str(realistic_model), "-p", "a fox", "--width", "64", "--height",
                   "64", "--frames", "22", "--steps", "2", "-o", "", env={"H3_SIM_DEVICE_NAME": device})
    assert done.returncode == 0, done.stderr
    phases = {phase for phase, _, _ in progress_records(done.stderr)}
    assert ("denoise enqueue" in phases) is enqueue and "denoise" in phases


# ----------------------------------------------------------------------------- the tokenizer

PROMPTS = ["a red fox runs through snow", "", "  leading and trailing  ", "Don't STOP, we'll see!",
           "numbers 12345 and 3.14", "line one\nline two\r\n\n  indented", "emoji 🦊🎬 and accents café naïve",
           "Cafe\u0301 decomposed", "<|im_start|>user\nhello<|im_end|>", "tabs\tand   spaces",
           "中文提示：一只狐狸", "punctuation!!! ??? ...", "x" * 300]


def _trained_tokenizer(path: Path) -> Path:
    """A byte-level BPE with real merges, in Qwen2's tokenizer.json format (NFC, null unk, the
    Qwen2 split pattern), trained by Hugging Face's `tokenizers` on a small text."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers
    tokenizer = tokenizers.Tokenizer(models.BPE(unk_token=None))
    tokenizer.normalizer = normalizers.NFC()
    pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  show_progress=False)
    corpus = [p for p in PROMPTS if p] * 20 + ["the quick brown fox jumps over the lazy dog " * 5,
                                               "we'll they're I'm you've it's she'd " * 5]
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    tokenizer.save(str(path))
    return path


class _Tokenizer:
    """upstream's h3_tokenizer.h as exported by the built libh3 (the portable backend's)."""

    def __init__(self, library: Path, tokenizer_json: Path) -> None:
        self.lib = ctypes.CDLL(str(library))
        self.lib.h3_tokenizer_load.restype = ctypes.c_void_p
        self.lib.h3_tokenizer_load.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
        self.lib.h3_tokenizer_encode.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int,
                                                 ctypes.POINTER(ctypes.POINTER(ctypes.c_uint32)),
                                                 ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p, ctypes.c_size_t]
        self.lib.h3_tokenizer_decode.restype = ctypes.c_void_p
        self.lib.h3_tokenizer_decode.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32), ctypes.c_size_t,
                                                 ctypes.c_char_p, ctypes.c_size_t]
        self.lib.h3_tokenizer_ids_free.argtypes = [ctypes.c_void_p]
        self.lib.h3_tokenizer_free.argtypes = [ctypes.c_void_p]
        self.error = ctypes.create_string_buffer(512)
        self.handle = self.lib.h3_tokenizer_load(str(tokenizer_json).encode(), self.error, 512)

    def encode(self, text: str, pad_empty: bool = False) -> list[int]:
        ids = ctypes.POINTER(ctypes.c_uint32)()
        count = ctypes.c_size_t()
        assert self.lib.h3_tokenizer_encode(self.handle, text.encode(), int(pad_empty), ctypes.byref(ids),
                                            ctypes.byref(count), self.error, 512), self.error.value
        values = [ids[i] for i in range(count.value)]
        self.lib.h3_tokenizer_ids_free(ids)
        return values

    def decode(self, ids: list[int]) -> str:
        array = (ctypes.c_uint32 * len(ids))(*ids)
        pointer = self.lib.h3_tokenizer_decode(self.handle, array, len(ids), self.error, 512)
        assert pointer, self.error.value
        text = ctypes.string_at(pointer).decode()
        ctypes.CDLL(None).free(ctypes.c_void_p(pointer))
        return text


def test_token_ids_are_hugging_faces_for_a_trained_byte_level_bpe(upstream_engine, tmp_path: Path) -> None:  # noqa: F811
    import tokenizers
    path = _trained_tokenizer(tmp_path / "tokenizer.json")
    oracle = tokenizers.Tokenizer.from_file(str(path))
    ours = _Tokenizer(upstream_engine.library, path)
    assert ours.handle, ours.error.value
    for prompt in PROMPTS:
        expected = oracle.encode(prompt, add_special_tokens=False).ids
        assert ours.encode(prompt) == expected, prompt
        assert ours.decode(expected) == oracle.decode(expected, skip_special_tokens=False), prompt
    assert ours.encode("", pad_empty=True) == [151643]


@pytest.mark.parametrize("change, message", [
    (lambda c: c["model"].update(type="WordPiece"), "unexpected tokenizer specification"),
    (lambda c: c["model"].update(unk_token="<unk>"), "unexpected tokenizer specification"),
    (lambda c: c["model"].pop("unk_token"), "unexpected tokenizer specification"),
    (lambda c: c.update(normalizer={"type": "NFKC"}), "unexpected tokenizer specification"),
    (lambda c: c["model"].update(merges=["nospace"]), "invalid tokenizer merge"),
    (lambda c: c["added_tokens"][0].update(lstrip=True), "unsupported added-token policy"),
])
def test_tokenizer_json_refusals_are_upstreams(upstream_engine, realistic_model: Path, tmp_path: Path,  # noqa: F811
                                               change, message) -> None:
    config = json.loads((realistic_model / "FL2VA/tokenizer/tokenizer.json").read_text())
    change(config)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(config))
    ours = _Tokenizer(upstream_engine.library, path)
    assert not ours.handle and ours.error.value.decode() == message


# ----------------------------------------------------------------------------- the engines

def test_one_shot_render_through_upstreams_cli(upstream_engine, realistic_model: Path,  # noqa: F811
                                               tmp_path: Path) -> None:
    engine = OneShotEngine(upstream_engine.program, realistic_model, stall_timeout=120)
    events = []
    output = tmp_path / "fox.mp4"
    result = engine.generate(fast_request(), output, on_progress=events.append)
    assert _phases(events) == T2VA_PHASES
    assert result.frames is not None and result.frames.shape == (22, 64, 96, 3)
    assert result.audio is not None and result.audio.shape == (2, 37 * 800) and np.isfinite(result.audio).all()
    assert output.is_file() and "h3: wrote" in result.engine_log


def test_upstream_faults_crash_and_gpu_failure(upstream_engine, realistic_model: Path, tmp_path: Path,  # noqa: F811
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    engine = OneShotEngine(upstream_engine.program, realistic_model, stall_timeout=120)
    monkeypatch.setenv("H3_SIM_CRASH_PHASE", "text encoder:3")
    with pytest.raises(EngineCrashedError):
        engine.generate(fast_request(), tmp_path / "crash.mp4")
    monkeypatch.delenv("H3_SIM_CRASH_PHASE")
    monkeypatch.setenv("H3_SIM_FAIL_PHASE", "denoise")
    monkeypatch.setenv("H3_SIM_FAIL_MESSAGE", "Metal said: out of resources (0x1)")
    with pytest.raises(EngineError) as caught:
        engine.generate(fast_request(), tmp_path / "fail.mp4")
    assert "Metal said: out of resources (0x1)" in (caught.value.engine_message or "")
    assert not list(tmp_path.glob("*.mp4"))


def test_library_engine_over_upstreams_libh3_renders_previews_and_cancels(upstream_engine,  # noqa: F811
                                                                          realistic_model: Path,
                                                                          tmp_path: Path) -> None:
    with LibraryEngine(upstream_engine.library, realistic_model, idle_timeout=120) as engine:
        previews = []
        request = fast_request(steps=3)
        result = engine.generate(request, tmp_path / "lib.mp4", on_preview=previews.append)
        assert [p.step for p in previews] == [0, 1, 2]
        assert all(p.image.shape == (64, 96, 3) and p.image.dtype == np.uint8 for p in previews)
        assert result.frames is not None and result.frames.shape == (22, 64, 96, 3)
        assert (tmp_path / "lib.mp4").is_file()
        cancel = CancelToken()

        def on_progress(event) -> None:
            if event.phase == "denoise":
                cancel.cancel()

        with pytest.raises(GenerationCancelled):
            engine.generate(fast_request("another prompt"), tmp_path / "cancelled.mp4", on_progress=on_progress,
                            cancel=cancel)
        assert not (tmp_path / "cancelled.mp4").exists()
        assert engine.generate(fast_request(seed=5), None, want_audio=False).frames is not None


# ----------------------------------------------------------------------------- the layers above the engines

@pytest.mark.timeout(900)     # four renders, three of 56 frames: a safety net for a loaded machine
def test_a_four_shot_story_with_every_continuation_on_upstreams_h3(upstream_engine, realistic_model: Path,  # noqa: F811
                                                                    tmp_path: Path) -> None:
    """Anchor (FL2VA's first frame), cut and tail (Ref2VA with the previous shot's video and sound):
    every request the story layer makes, through upstream's own validation and phase order."""
    from h3bridge.story import Storyboard, run_story
    from story_helpers import FOUR_SHOTS, write_story
    # SSD streaming: the realistic fixture has the released model's sizes, which the memory planner
    # (rightly) finds too big for this machine without it; upstream's streaming path runs too.
    story = Storyboard.from_toml(write_story(tmp_path, "ssd_streaming = true\n" + FOUR_SHOTS))
    with OneShotEngine(upstream_engine.program, realistic_model, stall_timeout=120) as engine:
        result = run_story(story, tmp_path / "film.mp4", engine=engine)
    assert result.rendered == 4 and result.assembled and (tmp_path / "film.mp4").is_file()


def test_the_server_renders_a_clip_on_upstreams_h3(upstream_engine, realistic_model: Path,  # noqa: F811
                                                    tmp_path: Path) -> None:
    from server_helpers import KEY, ServerProcess, isolated_env, mp4_frame_count, openai_client, wait_finished
    with ServerProcess(tmp_path / "data", realistic_model, tmp_path / "logs", env=isolated_env(tmp_path),
                       engine_path=str(upstream_engine.program)) as server:
        client = openai_client(server, KEY)
        created = client.videos.create(prompt="a red fox runs through snow", size="96x64",
                                       extra_body={"frames": 22, "steps": 2, "ssd_streaming": True})
        finished = wait_finished(client, created.id, timeout=300)
        assert finished.status == "completed", finished.error
        assert mp4_frame_count(client.videos.download_content(created.id).read()) == 22


def test_the_comfyui_adapter_renders_on_upstreams_h3(upstream_engine, realistic_model: Path,  # noqa: F811
                                                     tmp_path: Path) -> None:
    from h3bridge.comfy import adapter
    settings = adapter.GenerateSettings(prompt="a red fox", preset="preview", width=96, height=64,
                                        length_unit="frames", frames=22, ssd_streaming="on")
    events = []
    outputs = adapter.run_generate(adapter.EngineHandle(upstream_engine.program, realistic_model), settings,
                                   adapter.GenerateInputs(), scratch_parent=tmp_path / "scratch",
                                   output_dir=tmp_path / "out", want_image=True, on_progress=events.append,
                                   cancel=CancelToken())
    assert outputs.image.shape == (22, 64, 96, 3) and not outputs.image_is_placeholder
    assert outputs.video_path.is_file() and outputs.sample_rate == 32000
    assert events and events[-1].fraction == pytest.approx(1.0)
