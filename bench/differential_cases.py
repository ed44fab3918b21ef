"""The differential checks' inputs: a workspace (fixture models, damaged copies, media) and a
deterministic generator of CLI cases, interactive-session scripts and C-API call groups.

Cases are plain JSON-able dicts, so a run can be saved, re-run against one side only, and
compared again. In arguments, environment values and stdin, three placeholders are resolved by
the runner: `{MODEL:name}` (a model folder of the workspace), `{MEDIA:name}` (a media file of the
workspace) and `{CASE}` (the case's own working folder, one per side).

    workspace = build_workspace(root)              # models/ and media/ under root, built once
    cases = generate_cases(seed=22)                # [{"id", "category", "kind", ...}, ...]

Kinds: "cli" (argv, env, stdin, compared after the process ends), "session" (the interactive
mode: argv + stdin lines), "capi" (ops run by bench/differential_capi.py inside one process
over one h3_ctx). Generation jobs are kept tiny (64x32, 22 frames, 2 steps) so that both sides
render them in about a second.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from h3bridge.sim.fixture import write_fixture_model  # noqa: E402

TINY_JOB = ["--width", "64", "--height", "32", "--frames", "22", "--steps", "2"]
PROMPTS = ["a red fox in snow", "waves", "Ünïcödé prompt ✓", "x" * 300, "two\tparts",
           "  leading and trailing  ", "a cat; rm -rf / $(echo no)", "中文提示"]

# ---------------------------------------------------------------- workspace


def _header_bytes(header: object) -> bytes:
    data = json.dumps(header).encode()
    return struct.pack("<Q", len(data)) + data


def _first_shard(folder: Path) -> Path:
    return sorted(folder.glob("*.safetensors"))[0]


def _rewrite(path: Path, data: bytes, size: int | None = None) -> None:
    """Replace `path` by a new file (the variants share unchanged files with the base model by
    hard links, so nothing is ever written into a file in place); `size` extends it sparsely."""
    path.unlink()
    with open(path, "wb") as handle:
        handle.write(data)
        if size is not None and size > len(data):
            handle.truncate(size)


def _damage_header(path: Path, kind: str) -> None:
    """Replace a shard's header with a broken one of `kind`, keeping its data section (real
    bytes in a small shard; a realistic shard's data is a sparse run of zeros, kept sparse)."""
    with open(path, "rb") as handle:
        length = struct.unpack("<Q", handle.read(8))[0]
        header = json.loads(handle.read(length))
        total = path.stat().st_size
        body_length = total - 8 - length
        body = handle.read(body_length) if body_length <= 16 * 1024 * 1024 else b""
    name = next(key for key in header if key != "__metadata__")

    def write(new_header: bytes) -> None:
        _rewrite(path, new_header + body, len(new_header) + body_length)

    if kind == "length-past-end":
        raw = json.dumps(header).encode()
        write(struct.pack("<Q", total) + raw)
    elif kind == "length-huge":
        raw = json.dumps(header).encode()
        write(struct.pack("<Q", 300 * 1024 * 1024) + raw)
    elif kind == "truncated":
        _rewrite(path, struct.pack("<Q", length)[:5])
    elif kind == "empty":
        _rewrite(path, b"")
    elif kind == "not-json":
        write(struct.pack("<Q", length) + b"{not json" + b" " * (length - 9))
    elif kind == "not-object":
        write(_header_bytes([1, 2, 3]))
    elif kind == "dtype-f8":
        header[name]["dtype"] = "F8_E4M3"
        write(_header_bytes(header))
    elif kind == "rank-9":
        count = 1
        for size in header[name]["shape"]:
            count *= size
        header[name]["shape"] = [count] + [1] * 8
        write(_header_bytes(header))
    elif kind == "bytes-mismatch":
        begin, end = header[name]["data_offsets"]
        header[name]["data_offsets"] = [begin, end + 2]
        write(_header_bytes(header))
    elif kind == "offsets-past-end":
        header[name]["data_offsets"] = [body_length + 8, body_length + 8 + 2]
        header[name]["shape"] = [1]
        header[name]["dtype"] = "BF16"
        write(_header_bytes(header))
    elif kind == "missing-dtype":
        del header[name]["dtype"]
        write(_header_bytes(header))
    elif kind == "metadata-not-string":
        header["__metadata__"] = {"format": 5}
        write(_header_bytes(header))
    elif kind == "trailing-comma":
        text = json.dumps(header)
        write(struct.pack("<Q", len(text) + 1) + text[:-1].encode() + b",}")
    else:
        raise ValueError(kind)


APPLEDOUBLE = (b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        \x00\x02"
               + b"\x00" * 16 + b"ATTR" + b"\x00" * 4000)


def _model_variants() -> dict[str, object]:
    """name -> a function damaging a fresh copy of the full fixture (root: Path) -> None."""

    def remove(relative: str):
        def apply(root: Path) -> None:
            target = root / relative
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink()
        return apply

    def remove_shards(relative: str):
        def apply(root: Path) -> None:
            for shard in (root / relative).glob("*.safetensors"):
                shard.unlink()
        return apply

    def header(relative: str, kind: str):
        return lambda root: _damage_header(_first_shard(root / relative), kind)

    def write(relative: str, data: bytes):
        def apply(root: Path) -> None:
            _rewrite(root / relative, data)
        return apply

    def to_dir(relative: str):
        def apply(root: Path) -> None:
            (root / relative).unlink()
            (root / relative).mkdir()
        return apply

    def edit_json(relative: str, change):
        def apply(root: Path) -> None:
            path = root / relative
            value = json.loads(path.read_text())
            change(value)
            _rewrite(path, json.dumps(value).encode())
        return apply

    def appledouble(relative: str):
        def apply(root: Path) -> None:
            shard = _first_shard(root / relative)
            (shard.parent / f"._{shard.name}").write_bytes(APPLEDOUBLE)
        return apply

    def dotfile_copy(relative: str):
        def apply(root: Path) -> None:
            shard = _first_shard(root / relative)
            os.link(shard, shard.parent / ".hidden.safetensors")
        return apply

    def std_value(relative: str, value: float):
        def change(config: dict) -> None:
            config["latents_std"][3] = value
        return edit_json(relative, change)

    variants: dict[str, object] = {
        "ok": None,
        "no-ref2va": remove("Ref2VA"),
        "no-transformer-config": remove("FL2VA/transformer/config.json"),
        "transformer-config-dir": to_dir("FL2VA/transformer/config.json"),
        "no-tokenizer": remove("FL2VA/tokenizer/tokenizer.json"),
        "tokenizer-dir": to_dir("FL2VA/tokenizer/tokenizer.json"),
        "tokenizer-not-json": write("FL2VA/tokenizer/tokenizer.json", b"{oops"),
        "tokenizer-array": write("FL2VA/tokenizer/tokenizer.json", b"[]"),
        "tokenizer-wordpiece": edit_json("FL2VA/tokenizer/tokenizer.json",
                                         lambda t: t["model"].update(type="WordPiece")),
        "tokenizer-bad-merge": edit_json("FL2VA/tokenizer/tokenizer.json",
                                         lambda t: t["model"].update(merges=["nospace"])),
        "tokenizer-added-lstrip": edit_json("FL2VA/tokenizer/tokenizer.json",
                                            lambda t: t["added_tokens"][0].update(lstrip=True)),
        "no-text-encoder-shards": remove_shards("FL2VA/text_encoder"),
        "no-transformer-shards": remove_shards("FL2VA/transformer"),
        "no-vae-shards": remove_shards("FL2VA/video_vae/source"),
        "no-audio-vae-shards": remove_shards("FL2VA/audio_vae"),
        "no-text-encoder-dir": remove("FL2VA/text_encoder"),
        "no-video-vae-source": remove("FL2VA/video_vae/source"),
        "no-video-vae-config": remove("FL2VA/video_vae/config.json"),
        "no-audio-vae-config": remove("FL2VA/audio_vae/config.json"),
        "video-vae-config-dir": to_dir("FL2VA/video_vae/config.json"),
        "video-vae-config-empty": write("FL2VA/video_vae/config.json", b""),
        "video-vae-std-zero": std_value("FL2VA/video_vae/config.json", 0.0),
        "audio-vae-std-negative": std_value("FL2VA/audio_vae/config.json", -1.0),
        "video-vae-short-mean": edit_json("FL2VA/video_vae/config.json",
                                          lambda c: c.update(latents_mean=c["latents_mean"][:5])),
        "audio-vae-no-std": edit_json("FL2VA/audio_vae/config.json",
                                      lambda c: c.pop("latents_std")),
        "appledouble-transformer": appledouble("FL2VA/transformer"),
        "appledouble-text-encoder": appledouble("FL2VA/text_encoder"),
        "appledouble-vae": appledouble("FL2VA/video_vae/source"),
        "appledouble-audio": appledouble("FL2VA/audio_vae"),
        "dotfile-shard": dotfile_copy("FL2VA/transformer"),
        "ref2va-no-index": remove("Ref2VA/transformer/model.safetensors.index.json"),
        "ref2va-no-shards": remove_shards("Ref2VA/transformer"),
        "ref2va-bad-header": header("Ref2VA/transformer", "dtype-f8"),
        "index-json-only": remove_shards("FL2VA/audio_vae"),
    }
    for kind in ("length-past-end", "length-huge", "truncated", "empty", "not-json", "not-object",
                 "dtype-f8", "rank-9", "bytes-mismatch", "offsets-past-end", "missing-dtype",
                 "metadata-not-string", "trailing-comma"):
        variants[f"transformer-{kind}"] = header("FL2VA/transformer", kind)
    for part, folder in (("text", "FL2VA/text_encoder"), ("vae", "FL2VA/video_vae/source"),
                         ("audio", "FL2VA/audio_vae")):
        for kind in ("length-past-end", "dtype-f8", "not-json"):
            variants[f"{part}-{kind}"] = header(folder, kind)
    return variants


MODEL_VARIANTS = tuple(_model_variants())


def _ffmpeg(*args: str) -> None:
    subprocess.run(["ffmpeg", "-v", "error", "-y", *args], check=True, timeout=120)


def _build_media(media: Path) -> None:
    media.mkdir(parents=True, exist_ok=True)
    _ffmpeg("-f", "lavfi", "-i", "color=c=red:s=80x60", "-frames:v", "1", str(media / "red.png"))
    _ffmpeg("-f", "lavfi", "-i", "color=c=blue:s=320x240", "-frames:v", "1", str(media / "blue.jpg"))
    _ffmpeg("-f", "lavfi", "-i", "testsrc=s=64x48:r=24:d=3", "-f", "lavfi",
            "-i", "sine=f=440:r=32000:d=3", "-shortest", "-c:v", "libx264", "-pix_fmt", "yuv420p",
            "-c:a", "aac", str(media / "clip.mp4"))
    _ffmpeg("-f", "lavfi", "-i", "testsrc=s=64x48:r=24:d=1", "-c:v", "libx264",
            "-pix_fmt", "yuv420p", str(media / "silent.mp4"))
    _ffmpeg("-f", "lavfi", "-i", "sine=f=220:r=32000:d=3", str(media / "tone.wav"))
    _ffmpeg("-f", "lavfi", "-i", "sine=f=220:r=32000:d=1", str(media / "short.wav"))
    _ffmpeg("-f", "lavfi", "-i", "sine=f=220:r=32000:d=16", str(media / "long.wav"))
    (media / "notimage.txt").write_text("this is not an image\n")
    (media / "empty.png").write_bytes(b"")


def build_workspace(root: Path, *, realistic: bool = True) -> Path:
    """models/<variant>/ and media/ under `root` (reused when already complete).

    The models are the realistic fixture (released shapes in sparse files), the only kind
    upstream's loaders accept; each variant is the base model hard-linked file by file, with
    its damaged files replaced (never written in place)."""
    root = Path(root)
    done = root / ".complete"
    if done.exists():
        return root
    models = root / "models"
    base = models / "ok"
    if not base.exists():
        write_fixture_model(base, ref2va=True, realistic=realistic)
    for name, damage in _model_variants().items():
        target = models / name
        if name == "ok" or target.exists():
            continue
        shutil.copytree(base, target, copy_function=os.link)
        damage(target)   # type: ignore[operator]
    (models / "empty-dir").mkdir(exist_ok=True)
    (models / "a-file").write_text("not a model folder\n")
    link = models / "symlink-ok"
    if not link.exists():
        link.symlink_to(base)
    _build_media(root / "media")
    done.write_text("1\n")
    return root


# ---------------------------------------------------------------- CLI cases

INT_VALUES = ["64", "32", "0", "-1", "abc", "", " 64", "64 ", "+64", "2147483647", "2147483648",
              "99999999999999999999", "0x40", "1e3", "064", "6.4"]
SEED_VALUES = ["0", "7", "-1", "18446744073709551615", "18446744073709551616", "abc", "", " 5",
               "+9", "-0"]
SECONDS_VALUES = ["1", "0.5", "0.9", "0", "-1", "nan", "inf", "1e-9", "0x1p0", "abc", "", "15",
                  "89478485.34", "1e400", " 2", "2s"]
FLAGS = ["--token-reduction", "--ssd-streaming", "--use-int8-row-fc2", "--use-reference-rope",
         "--use-slower-bf16-mlp", "--use-slower-bf16-qkv", "--use-slower-bf16-attention-output",
         "--use-slower-row-major-attention-output", "--use-slower-unfused-int8-inputs",
         "--use-slower-unfused-qkv-rope", "--use-slower-scalar-qkv-rms",
         "--use-slower-uncached-int8-scales", "--use-slower-dynamic-fc1-k",
         "--use-slower-grouped-quantizer"]
ODD_TOKENS = ["--bogus", "--wid=64", "--hei", "32", "--use-slower", "--info=1", "--show=yes", "-x",
              "-hd", "--", "operand", "-", "--ref-image-size=MAX", "--fr", "22", "--s", "3",
              "--prompt=", "-p", "-o", "--model-dir", "--zoom", "--seconds", "--frames",
              "--ref-video-audio", "--seed=", "--profile", "--=x", "--help=1", "-dp"]
NUMERIC_OPTIONS = ["--width", "--height", "--render-width", "--render-height", "--frames", "--steps",
                   "--reuse", "--layers", "--core-reuse", "--zoom"]
MEDIA_NAMES = ["red.png", "blue.jpg", "clip.mp4", "silent.mp4", "tone.wav", "short.wav", "long.wav",
               "notimage.txt", "empty.png", "missing.png"]
REF_OPTIONS = ["--ref-image", "--ref-video", "--ref-silent-video", "--ref-audio"]


def _media(name: str) -> str:
    return "{CASE}/nowhere/" + name if name == "missing.png" else "{MEDIA:" + name + "}"


def _random_option(rng: random.Random) -> list[str]:
    roll = rng.random()
    if roll < 0.35:
        return [rng.choice(NUMERIC_OPTIONS), rng.choice(INT_VALUES)]
    if roll < 0.45:
        return ["--seed", rng.choice(SEED_VALUES)]
    if roll < 0.52:
        return ["--seconds", rng.choice(SECONDS_VALUES)]
    if roll < 0.62:
        return [rng.choice(FLAGS)]
    if roll < 0.80:
        token = rng.choice(ODD_TOKENS)
        return [token] if rng.random() < 0.5 else [token, rng.choice(INT_VALUES + ["x"])]
    if roll < 0.88:
        return [rng.choice(REF_OPTIONS), _media(rng.choice(MEDIA_NAMES))]
    if roll < 0.92:
        return ["--ref-image-size", rng.choice(["match", "max", "MAX", "", "auto"])]
    if roll < 0.96:
        return [rng.choice(["--first-frame", "--last-frame"]), _media(rng.choice(MEDIA_NAMES))]
    return [rng.choice(["-h", "--help", "--frames-dir", "--info"])]


def _cli(case_id: str, category: str, args: list[str], env: dict[str, str] | None = None,
         stdin: str = "") -> dict[str, object]:
    return {"id": case_id, "category": category, "kind": "cli", "args": args, "env": env or {},
            "stdin": stdin}


def _argument_cases(rng: random.Random, count: int) -> list[dict[str, object]]:
    """Random argument lists, mostly ending before any generation (exit 2, --info, or a
    parameter h3_generate rejects before its first phase)."""
    cases = []
    for index in range(count):
        argv: list[str] = []
        for _ in range(rng.randint(1, 5)):
            argv += _random_option(rng)
        ending = rng.random()
        if ending < 0.45:
            argv += ["--info"]
        elif ending < 0.9:
            argv += ["-p", rng.choice(PROMPTS), "--steps", rng.choice(["1", "1001", "0"])]
        if rng.random() < 0.93:
            position = rng.randint(0, len(argv))
            argv[position:position] = ["-d", "{MODEL:ok}"]
        if rng.random() < 0.1:
            argv += ["--", "operand"]
        cases.append(_cli(f"args-{index:04d}", "cli-args", argv))
    return cases


EDGE = {
    "--width": ["64", "32", "31", "33", "0", "96", "768", "1344", "1376"],
    "--height": ["32", "64", "0", "48", "1344", "1376", "768"],
    "--frames": ["22", "0", "4", "5", "6", "21", "23", "39", "363", "400"],
    "--steps": ["2", "1", "0", "1001"],
    "--reuse": ["1", "2", "3", "4", "0"],
    "--layers": ["50", "35", "34", "51", "45"],
    "--core-reuse": ["1", "0", "4", "6", "7"],
    "--render-width": ["32", "64", "0", "48", "96"],
    "--render-height": ["32", "16", "64", "0"],
}


def _validation_cases(rng: random.Random, count: int) -> list[dict[str, object]]:
    """-p jobs whose parameters sit on h3_valid_params's edges; each case has at least one
    invalid value, so nothing renders (rendering is the render family's)."""
    cases = []
    for index in range(count):
        values = {"--width": "64", "--height": "32", "--frames": "22", "--steps": "2"}
        for option in rng.sample(list(EDGE), rng.randint(1, 3)):
            values[option] = rng.choice(EDGE[option][1:] if rng.random() < 0.8 else EDGE[option])
        argv = ["-d", "{MODEL:ok}", "-p", rng.choice(PROMPTS)]
        for option, value in values.items():
            argv += [option, value]
        extra = rng.random()
        if extra < 0.25:
            argv += rng.sample(FLAGS[:4], rng.randint(1, 2))
        elif extra < 0.4:
            for _ in range(rng.randint(1, 13)):
                argv += [rng.choice(REF_OPTIONS), _media(rng.choice(["red.png", "clip.mp4", "tone.wav"]))]
        elif extra < 0.5:
            argv += ["--first-frame", _media("red.png"), "--ref-image", _media("red.png")]
        elif extra < 0.55:
            argv += ["--ref-video-audio", _media("clip.mp4"), _media("tone.wav")]
        elif extra < 0.6:
            argv[1] = "{MODEL:no-ref2va}"
            argv += ["--ref-image", _media("red.png")]
        cases.append(_cli(f"valid-{index:04d}", "cli-validate", argv))
    return cases


def _model_cases(rng: random.Random) -> list[dict[str, object]]:
    """Every model variant with --info, with a tiny job, and (a few) interactively on empty stdin."""
    cases = []
    names = [*MODEL_VARIANTS, "empty-dir", "a-file", "symlink-ok", "does-not-exist"]
    for name in names:
        model = "{MODEL:" + name + "}"
        cases.append(_cli(f"model-info-{name}", "cli-model", ["-d", model, "--info"]))
        cases.append(_cli(f"model-job-{name}", "cli-model",
                          ["-d", model, "-p", "a fox", *TINY_JOB, "-o", "{CASE}/out.mp4"]))
        cases.append(_cli(f"model-ref-{name}", "cli-model",
                          ["-d", model, "-p", "a fox", *TINY_JOB, "-o", "{CASE}/out.mp4",
                           "--ref-image", _media("red.png")]))
        cases.append(_cli(f"model-bad-{name}", "cli-model",
                          ["-d", model, "-p", "a fox", "--steps", "1"]))
    for name in rng.sample(names, 12):
        cases.append(_cli(f"model-session-{name}", "cli-model",
                          ["-d", "{MODEL:" + name + "}", "--seed", "3"], stdin="!status\n"))
    cases.append(_cli("model-empty-arg", "cli-model", ["-d", "", "--info"]))
    cases.append(_cli("model-relative", "cli-model", ["-d", "nowhere/model", "--info"]))
    return cases


ENVS = [
    {"H3_FFMPEG": "/nonexistent/ffmpeg"}, {"H3_FFPROBE": "/nonexistent/ffprobe"},
    {"H3_FFMPEG": "/bin/false"}, {"H3_FFMPEG": ""}, {"H3_PROFILE": "1"}, {"H3_PROFILE": "0"},
    {"H3_VAE_TILE_PIXELS": "256"}, {"H3_VAE_TILE_PIXELS": "16"}, {"H3_CPU_SAMPLER": "1"},
    {"H3_GPU_SAMPLER": "0"}, {"H3_GPU_SAMPLER": "1"}, {"H3_SIM_DEVICE_NAME": "Apple M2 Ultra"},
    {"H3_SIM_METAL4": "0"}, {"H3_SIM_NO_METAL": "1"}, {"POSIXLY_CORRECT": "1"}, {"HOME": None},
    {"TERM_PROGRAM": "vscode"}, {"H3_TOKEN_REDUCTION": "1"}, {"LC_ALL": "C"},
]


def _env_cases(rng: random.Random, count: int) -> list[dict[str, object]]:
    cases = []
    shapes = [
        ["--info"],
        ["-p", "a fox", *TINY_JOB, "-o", "{CASE}/out.mp4"],
        ["-p", "a fox", *TINY_JOB, "-o", "{CASE}/out.mp4", "--use-int8-row-fc2"],
        ["-p", "a fox", *TINY_JOB, "-o", "{CASE}/out.mp4", "--first-frame", _media("red.png")],
        ["-p", "a fox", *TINY_JOB, "-o", "{CASE}/out.mp4", "--ref-image", _media("blue.jpg")],
        ["-p", "a fox", "--frames", "4"],
        ["--bogus", "-p", "x", "--info"],
    ]
    for index in range(count):
        env = dict(ENVS[index % len(ENVS)])
        if rng.random() < 0.3:
            env.update(rng.choice(ENVS))
        argv = ["-d", "{MODEL:ok}", *rng.choice(shapes)]
        if env.get("POSIXLY_CORRECT"):
            argv = ["--info", "operand", *argv]
        cases.append(_cli(f"env-{index:04d}", "cli-env", argv, env))
    return cases


def _render_cases(rng: random.Random, count: int) -> list[dict[str, object]]:
    """Tiny jobs that run (or fail) inside generation: outputs, frames folders, anchors,
    references, prompts, seeds, --seconds, --show without a terminal, --profile."""
    variants: list[list[str]] = [
        ["-o", "{CASE}/out.mp4"], [], ["-o", ""], ["-o", "{CASE}/sub/out.mp4"],
        ["-o", "{CASE}"], ["-o", "{CASE}/out.mp4", "--frames-dir", "{CASE}/frames"],
        ["-o", "", "--frames-dir", "{CASE}/frames"], ["-o", "", "--frames-dir", "{CASE}/a/b"],
        ["-o", "", "--frames-dir", "{MEDIA:red.png}"],
        ["-o", "{CASE}/out.mp4", "--first-frame", _media("red.png")],
        ["-o", "{CASE}/out.mp4", "--last-frame", _media("blue.jpg")],
        ["-o", "{CASE}/out.mp4", "--first-frame", _media("red.png"), "--last-frame", _media("blue.jpg")],
        ["-o", "{CASE}/out.mp4", "--first-frame", _media("notimage.txt")],
        ["-o", "{CASE}/out.mp4", "--first-frame", _media("missing.png")],
        ["-o", "{CASE}/out.mp4", "--first-frame", ""],
        ["-o", "{CASE}/out.mp4", "--ref-image", _media("red.png")],
        ["-o", "{CASE}/out.mp4", "--ref-image", _media("red.png"), "--ref-image-size", "max"],
        ["-o", "{CASE}/out.mp4", "--ref-image", _media("blue.jpg"), "--ref-audio", _media("tone.wav")],
        ["-o", "{CASE}/out.mp4", "--ref-image", _media("red.png"), "--ref-audio", _media("short.wav")],
        ["-o", "{CASE}/out.mp4", "--ref-image", _media("red.png"), "--ref-audio", _media("long.wav")],
        ["-o", "{CASE}/out.mp4", "--ref-silent-video", _media("silent.mp4")],
        ["-o", "{CASE}/out.mp4", "--ref-video", _media("clip.mp4")],
        ["-o", "{CASE}/out.mp4", "--ref-video", _media("silent.mp4")],
        ["-o", "{CASE}/out.mp4", "--ref-video-audio", _media("silent.mp4"), _media("tone.wav")],
        ["-o", "{CASE}/out.mp4", "--ref-image", _media("notimage.txt")],
        ["-o", "{CASE}/out.mp4", "--ref-image", _media("missing.png")],
        ["-o", "{CASE}/out.mp4", "--ref-audio", _media("tone.wav")],
        ["-o", "{CASE}/out.mp4", "--show"], ["-o", "{CASE}/out.mp4", "--profile"],
        ["-o", "{CASE}/out.mp4", "--seconds", "1"], ["-o", "{CASE}/out.mp4", "--reuse", "2"],
        ["-o", "{CASE}/out.mp4", "--core-reuse", "4"], ["-o", "{CASE}/out.mp4", "--layers", "35"],
        ["-o", "{CASE}/out.mp4", "--render-width", "32", "--render-height", "32",
         "--width", "64", "--height", "64"],
        ["-o", "{CASE}/out.mp4", "--token-reduction", "--ssd-streaming"],
        ["-o", "{CASE}/out.mp4", "--frames", "39"],
    ]
    cases = []
    for index in range(count):
        extra = variants[index % len(variants)]
        prompt = rng.choice(PROMPTS) if index % 3 else "a fox"
        argv = ["-d", "{MODEL:ok}", "-p", prompt, *TINY_JOB, "--seed", str(rng.randint(0, 99)), *extra]
        cases.append(_cli(f"render-{index:04d}", "cli-render", argv))
    cases.append(_cli("render-empty-prompt", "cli-render", ["-d", "{MODEL:ok}", "-p", "", *TINY_JOB]))
    cases.append(_cli("render-bad-utf8", "cli-render",
                      ["-d", "{MODEL:ok}", "-p", "caf\udce9", *TINY_JOB, "-o", "{CASE}/o.mp4"]))
    return cases


# ---------------------------------------------------------------- interactive sessions

SESSION_COMMANDS = [
    "!help", "!status", "!seed", "!seed 9", "!seed random", "!seed -1", "!seed abc", "!seed  12 ",
    "!size", "!size 64x32", "!size 64X64", "!size 64", "!size 0x0", "!size 64x32x", "!render-size",
    "!render-size native", "!render-size 32x32", "!render-size bad", "!frames", "!frames 22",
    "!frames 0", "!frames 4", "!frames x", "!seconds", "!seconds 1", "!seconds 0", "!seconds nan",
    "!seconds 0.5s", "!steps", "!steps 3", "!steps 0", "!steps 1001", "!reuse 2", "!reuse 33",
    "!layers 35", "!layers 51", "!core-reuse 4", "!core-reuse 7", "!token-reduction",
    "!token-reduction on", "!token-reduction maybe", "!ssd-streaming on", "!ssd-streaming",
    "!int8-row-fc2 on", "!int8-row-fc2 OFF", "!reference-rope 1", "!reference-rope 2",
    "!first", "!first {MEDIA:red.png}", "!first clear", "!first {MEDIA:notimage.txt}",
    "!first {CASE}/nowhere.png", "!last {MEDIA:blue.jpg}", "!last CLEAR", "!ref-image",
    "!ref-image {MEDIA:red.png}", "!ref-image {MEDIA:blue.jpg}", "!ref-image {MEDIA:notimage.txt}",
    "!refs", "!refs clear", "!refs bogus", "!ref-remove 1", "!ref-remove 5", "!ref-remove x",
    "!show", "!show on", "!show off", "!zoom 3", "!zoom 0", "!zoom x", "!open", "!open off",
    "!output", "!output {CASE}/outdir", "!output {MEDIA:red.png}", "!output", "!save",
    "!save {CASE}/saved.mp4", "!again", "!cache", "!cache clear", "!cache bogus", "!bogus", "!",
    "   !status   ", "!HELP", "!Seed 4", "", "   ",
]


def _session_cases(rng: random.Random, count: int) -> list[dict[str, object]]:
    cases = []
    for index in range(count):
        lines = [rng.choice(SESSION_COMMANDS) for _ in range(rng.randint(2, 10))]
        if index % 3 == 0:   # a third of the sessions render once (then the commands about results)
            position = rng.randint(0, len(lines))
            lines[position:position] = [rng.choice(["a fox", "  waves  ", "Ünïcödé"])]
            lines += rng.sample(["!again", "!save {CASE}/copy.mp4", "!cache", "!status"], 2)
            if rng.random() < 0.3:
                lines += ["!size 64x64", "a fox", "!cache"]
        if rng.random() < 0.5:
            lines.append(rng.choice(["!quit", "!exit", "!QUIT"]))
        argv = ["-d", "{MODEL:ok}", *TINY_JOB, "--seed", str(index)]
        choice = rng.random()
        if choice < 0.1:
            argv += ["--first-frame", "{MEDIA:red.png}"]
        elif choice < 0.2:
            argv += ["--ref-image", "{MEDIA:red.png}", "--ref-audio", "{MEDIA:tone.wav}"]
        elif choice < 0.25:
            argv += ["--show"]
        elif choice < 0.3:
            argv += ["-o", "{CASE}/ignored.mp4", "--frames-dir", "{CASE}/frames"]
        elif choice < 0.35:
            argv[1] = "{MODEL:no-ref2va}"
        cases.append({"id": f"session-{index:04d}", "category": "session", "kind": "session",
                      "args": argv, "env": {}, "stdin": "".join(line + "\n" for line in lines)})
    return cases


# ---------------------------------------------------------------- C-API call groups

TINY_PARAMS = {"width": 64, "height": 32, "frames": 22, "steps": 2}
# The phases of a tiny T2VA job with a frame callback and an output file, as (phase, completed)
# points at which a progress callback cancels.
CANCEL_POINTS = [("tokenizer", 0), ("tokenizer", 1), ("text encoder", 0), ("text encoder", 25),
                 ("text encoder", 50), ("refine text", 0), ("refine text", 1),
                 ("precompute AdaLN", 1), ("precompute AdaLN", 50), ("load transformer core", 1),
                 ("load transformer core", 50), ("denoise enqueue", 0), ("denoise enqueue", 1),
                 ("denoise enqueue", 2), ("denoise", 2), ("audio VAE", 0), ("audio VAE", 7),
                 ("video VAE load", 1), ("video VAE load", 36), ("FFmpeg", 0), ("FFmpeg", 22),
                 ("preview VAE load", 0), ("preview VAE load", 36), ("Qwen vision", 1),
                 ("video VAE encoder", 1), ("audio VAE encoder", 7)]
INVALID_FIELDS = [
    {"width": 0}, {"width": 33}, {"width": -32}, {"height": 1376}, {"width": 1344, "height": 800},
    {"render_width": 32}, {"render_width": 32, "render_height": 32}, {"render_width": 96, "render_height": 48},
    {"frames": 4}, {"frames": 5}, {"frames": 363}, {"frames": -1}, {"steps": 1}, {"steps": 1001},
    {"denoise_reuse": 0}, {"denoise_reuse": 4}, {"dit_layers": 34}, {"dit_layers": 51},
    {"core_reuse": 0}, {"core_reuse": 7}, {"token_reduction": 2}, {"use_int8_row_fc2": -1},
    {"use_reference_rope": 3}, {"ssd_streaming": 2}, {"ssd_streaming": 1, "use_int8_row_fc2": 1},
    {"use_int8_row_fc2": 1, "use_slower_bf16_mlp": 1}, {"preview_denoise": 2}, {"preview_denoise": 1},
    {"core_reuse": 2, "denoise_reuse": 2}, {"reference_image_size": 2}, {"reference_image_size": -1},
    {"use_slower_bf16_qkv": 7},
]
REF_SETS = [
    [], [["image", "red.png"]], [["image", "red.png"]] * 10, [["video", "clip.mp4", 1]] * 4,
    [["audio", "tone.wav"]], [["image", ""]], [["image", None]], [["kind0", "red.png"]],
    [["kind5", "red.png"]], [["video_audio", "silent.mp4", None]], [["video_audio", "silent.mp4", ""]],
    [["image", "red.png"]] * 13, [["image", "red.png"], ["audio", "tone.wav"]] + [["audio", "tone.wav"]] * 3,
    [["image", "red.png"], ["video_audio", "silent.mp4", "tone.wav"]],
    [["image", "notimage.txt"]], [["image", "missing.png"]], [["video", "clip.mp4", 1]],
    [["image", "red.png"], ["audio", "long.wav"]],
]


def _generate(prompt: object, params: dict[str, object] | None, **extra: object) -> dict[str, object]:
    return {"op": "generate", "prompt": prompt, "params": params, **extra}


def _capi_cases(rng: random.Random) -> list[dict[str, object]]:
    groups: list[list[dict[str, object]]] = []
    models: list[str] = []

    def add(ops: list[dict[str, object]], model: str | None = "ok") -> None:
        groups.append(ops)
        models.append(model)  # type: ignore[arg-type]

    # Invalid parameter structs, alone and after a valid call has set an error.
    for fields in INVALID_FIELDS:
        add([_generate("a fox", {**TINY_PARAMS, **fields}, on_frame=rng.random() < 0.5),
             {"op": "last_error"}, {"op": "cache_info"}])
    for refs in REF_SETS:
        for first in (None, "red.png"):
            add([_generate("a fox", {**TINY_PARAMS, "first_frame": first}, refs=refs,
                           output=True), {"op": "last_error"}])
    add([_generate(None, dict(TINY_PARAMS)), _generate("", dict(TINY_PARAMS)),
         _generate("a fox", None), {"op": "last_error"}])
    add([_generate("a fox", {**TINY_PARAMS, "reference_count": 2}, refs_null=True)])
    add([_generate("caf\udce9", dict(TINY_PARAMS))])
    # Loading: damaged models, NULL, "", then the global error text.
    for name in [*MODEL_VARIANTS, "empty-dir", "a-file", "does-not-exist"]:
        add([{"op": "device"}, {"op": "model"}, _generate("a fox", dict(TINY_PARAMS), output=True)],
            name)
    add([], None)
    add([], "")
    # Cancelling at every phase (progress callback), and from the frame callback.
    for phase, completed in CANCEL_POINTS:
        params = dict(TINY_PARAMS)
        refs: list[object] = []
        if phase in ("Qwen vision", "video VAE encoder"):
            params["first_frame"] = "red.png"
        if phase == "audio VAE encoder":
            refs = [["image", "red.png"], ["audio", "tone.wav"]]
        preview = phase == "preview VAE load"
        job = _generate("a fox", {**params, "preview_denoise": int(preview)}, refs=refs,
                        output=True, on_frame=True, cancel=["progress", phase, completed])
        add([job, {"op": "last_error"}, {"op": "cache_info"}])
        # With the session caches on: what a cancel leaves cached, and the next job's reuse.
        add([{"op": "cache_set", "enabled": 1}, job, {"op": "last_error"}, {"op": "cache_info"},
             _generate("a fox", dict(TINY_PARAMS), on_frame=False, output=False),
             {"op": "cache_info"}])
    for step, frame in [(0, 11), (1, 11), (-1, 0), (-1, 5), (-1, 21)]:
        add([_generate("a fox", {**TINY_PARAMS, "preview_denoise": int(step >= 0)}, on_frame=True,
                       output=True, cancel=["frame", step, frame]), {"op": "last_error"}])
    # Cache behaviour across calls.
    for _ in range(24):
        ops: list[dict[str, object]] = [{"op": "cache_set", "enabled": 1}]
        for _ in range(rng.randint(2, 4)):
            roll = rng.random()
            if roll < 0.5:
                fields = dict(TINY_PARAMS)
                if rng.random() < 0.3:
                    fields["steps"] = 3
                if rng.random() < 0.3:
                    fields["first_frame"] = "red.png"
                if rng.random() < 0.2:
                    fields["width"] = 32
                ops.append(_generate(rng.choice(["a fox", "waves"]), fields, on_frame=rng.random() < 0.3,
                                     output=rng.random() < 0.3))
            elif roll < 0.65:
                ops.append({"op": "cache_clear"})
            elif roll < 0.75:
                ops.append({"op": "cache_set", "enabled": rng.choice([0, 1, 2])})
            else:
                ops.append({"op": "cache_info"})
        ops.append({"op": "cache_info"})
        add(ops)
    # Successful jobs with previews, frames, outputs, anchors and references.
    for fields, refs in [({}, []), ({"preview_denoise": 1}, []), ({"first_frame": "red.png"}, []),
                         ({"last_frame": "blue.jpg"}, []), ({}, [["image", "red.png"]]),
                         ({"reference_image_size": 1}, [["image", "blue.jpg"]]),
                         ({}, [["video", "silent.mp4", 0]]), ({"frames": 56}, [["video", "clip.mp4", 1]]),
                         ({}, [["image", "red.png"], ["audio", "tone.wav"]]),
                         ({"seed": 2**64 - 1}, []), ({"render_width": 32, "render_height": 32,
                                                      "width": 64, "height": 64}, []),
                         ({"token_reduction": 1, "use_reference_rope": 1}, []),
                         ({"denoise_reuse": 2, "steps": 4}, []), ({"core_reuse": 6}, [])]:
        add([_generate("a fox", {**TINY_PARAMS, **fields}, refs=refs, on_frame=True, output=True),
             {"op": "last_error"}])
    add([_generate("a fox", dict(TINY_PARAMS), output=True, output_path="{CASE}/missing/out.mp4"),
         {"op": "last_error"}])
    cases = []
    for index, (ops, model) in enumerate(zip(groups, models)):
        cases.append({"id": f"capi-{index:04d}", "category": "capi", "kind": "capi",
                      "model": model, "ops": ops, "env": {}})
    return cases


def count_calls(case: dict[str, object]) -> int:
    """The C-API calls a case makes (h3_load_dir included)."""
    return 1 + len(case.get("ops") or [])   # type: ignore[arg-type]


def generate_cases(seed: int = 22) -> list[dict[str, object]]:
    rng = random.Random(seed)
    cases = (_argument_cases(rng, 1050) + _validation_cases(rng, 500) + _model_cases(rng)
             + _env_cases(rng, 120) + _render_cases(rng, 100) + _session_cases(rng, 210)
             + _capi_cases(rng))
    seen = set()
    for case in cases:
        assert case["id"] not in seen, case["id"]
        seen.add(case["id"])
    return cases
