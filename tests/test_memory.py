"""Memory planner: reproduces upstream's published figures and picks the least costly fix."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from h3bridge.errors import IntegrityError, MemoryPlanError, ModelError
from h3bridge.model.memory import (
    GIB,
    PROCESS_BASE,
    DitPath,
    MachineFacts,
    ModelSizes,
    dit_bytes_per_row,
    geometry,
    plan_memory,
    preflight,
    reference_image_canvas,
    reference_video_canvas,
    text_token_bytes,
    video_latent_t,
)
from h3bridge.fixes import Change
from h3bridge.model.inventory import inspect_model
from h3bridge.request import GenerationRequest, Reference, ReferenceImageSize, ReferenceKind, SlowerPath
from h3bridge.sim.fixture import write_fixture_model

PROMPT = "A red fox walks through fresh snow in a pine forest."
M4_PRO_24 = MachineFacts.mac(24, "Apple M4 Pro")


@pytest.fixture(scope="module")
def realistic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Released shapes in sparse files: ~288 GB nominal, no disk used."""
    return write_fixture_model(tmp_path_factory.mktemp("real") / "MiniMax-H3", realistic=True)


@pytest.fixture(scope="module")
def inventory(realistic: Path):
    return inspect_model(realistic)


def dit_tracked(plan) -> float:
    """The DiT phase without the process baseline and the host copy of its inputs: upstream's
    'tracked DiT storage' (GiB), the peak of the DiT's Metal tensors (h3_gpu_stats.peak_live_bytes)."""
    host = dict(plan.phase("DiT load + denoise").parts)["text embedding + condition rows until loaded"]
    return (plan.phase("DiT load + denoise").total - PROCESS_BASE - host) / GIB


def test_published_shapes_match_the_realistic_inventory(inventory) -> None:
    from_inventory = ModelSizes.from_inventory(inventory, "FL2VA")
    published = ModelSizes.published()
    assert from_inventory.dit_block_matrices == published.dit_block_matrices
    assert from_inventory.dit_block_int8 == published.dit_block_int8
    assert from_inventory.text_layer == published.text_layer
    assert from_inventory.adaln_row_bytes == published.adaln_row_bytes
    assert from_inventory.dit_blocks == 50 and from_inventory.text_layers_used == 50


def test_full_residency_reproduces_readme_tracked_dit_storage(inventory) -> None:
    # README: "the BF16 path's 36.4 GiB" (512 square, int8 section) and "about 36.5 GiB" (SSD
    # section, same path): 35.89 GiB of blocks + 0.35 GiB AdaLN + 0.21 GiB of h3_dit.c buffers
    # = 36.46 GiB, between the two published figures (the prompt length is not published)
    plan = plan_memory(GenerationRequest(PROMPT, width=512, height=512, frames=22), inventory, machine=M4_PRO_24)
    assert plan.dit_path == "BF16"
    assert 36.35 <= dit_tracked(plan) < 36.55


@pytest.mark.parametrize("width, height, published", [(512, 512, 2.0), (864, 480, 2.1)])
def test_ssd_streaming_reproduces_readme_tracked_dit_storage(inventory, width: int, height: int,
                                                             published: float) -> None:
    # README: "tracked DiT storage fell from about 36.5 GiB to 2.0 GiB at 512 square and 2.1 GiB at 864x480"
    request = GenerationRequest(PROMPT, width=width, height=height, frames=22, ssd_streaming=True)
    plan = plan_memory(request, inventory, machine=M4_PRO_24)
    assert plan.dit_path == "SSD streaming"
    assert dit_tracked(plan) == pytest.approx(published, abs=0.06)


def test_text_encoder_ring_matches_measured_peak(inventory) -> None:
    # issue 17: streamed Qwen encoder peaked ~2.7 GiB (ring of two layers on M1-M4)
    plan = plan_memory(GenerationRequest(PROMPT), inventory, machine=M4_PRO_24)
    assert (plan.phase("prompt encoding").total - PROCESS_BASE) / GIB == pytest.approx(2.7, abs=0.1)
    m5 = plan_memory(GenerationRequest(PROMPT), inventory, machine=MachineFacts.mac(128, "Apple M5 Max"))
    assert m5.phase("prompt encoding").total > plan.phase("prompt encoding").total   # ring of three


def test_video_decoder_and_preview_match_published_sizes(inventory) -> None:
    plan = plan_memory(GenerationRequest(PROMPT), inventory, machine=M4_PRO_24, preview=True)
    parts = dict(plan.phase("video decode").parts)
    assert parts["video VAE decoder"] / GIB == pytest.approx(9.0, abs=0.1)        # "~9 GiB"
    preview = dict(plan.phase("DiT load + denoise").parts)["preview VAE (--show)"]
    assert preview / GIB == pytest.approx(10.0, abs=0.1)                           # "roughly 10 GiB"


def test_dropped_layers_reduce_resident_dit(inventory) -> None:
    full = plan_memory(GenerationRequest(PROMPT, layers=50), inventory, machine=M4_PRO_24)
    fewer = plan_memory(GenerationRequest(PROMPT, layers=45), inventory, machine=M4_PRO_24)
    per_layer = (full.peak - fewer.peak) / 5 / GIB
    assert 0.65 <= per_layer <= 0.75      # "~0.65 GiB less per dropped layer"; 0.72 GiB of BF16 matrices


def test_default_request_does_not_fit_24_gb_without_ssd_streaming(inventory) -> None:
    plan = plan_memory(GenerationRequest(PROMPT, width=864, height=480, frames=56, layers=50), inventory,
                       machine=M4_PRO_24)
    assert not plan.fits and plan.peak_phase.name == "DiT load + denoise"
    assert plan.needs_ssd_streaming
    assert plan.suggestion is not None and plan.suggestion.changes == ("SSD streaming",)
    # The suggestion is request fields (issue 34.3); the CLI says them as flags, Python as keywords.
    from h3bridge.cli.engine import cli_words
    assert plan.suggestion.settings == (Change("ssd_streaming", True),)
    assert cli_words(plan.suggestion.settings) == "--ssd-streaming"
    assert "does not fit" in plan.verdict() and "ssd_streaming=True" in plan.verdict()
    assert plan.verdict(cli_words).endswith(": --ssd-streaming") and "--" not in plan.verdict()


def test_default_request_fits_24_gb_with_ssd_streaming(inventory) -> None:
    plan = plan_memory(GenerationRequest(PROMPT, width=864, height=480, frames=56, layers=50, ssd_streaming=True),
                       inventory, machine=M4_PRO_24)
    assert plan.fits and plan.suggestion is None and not plan.needs_ssd_streaming
    assert plan.peak_phase.name == "video decode"      # the DiT is no longer the largest phase
    assert "fits:" in plan.render()


def test_32_gb_needs_ssd_and_128_gb_does_not(inventory) -> None:
    # issues 18, 30: 24 GB and 32 GB Macs work only with --ssd-streaming
    request = GenerationRequest(PROMPT)
    assert not plan_memory(request, inventory, machine=MachineFacts.mac(32)).fits
    assert plan_memory(request, inventory, machine=MachineFacts.mac(128, "Apple M3 Max")).fits


def test_m5_quantizes_the_dit_by_default(inventory) -> None:
    m5 = MachineFacts.mac(128, "Apple M5 Max")
    int8 = plan_memory(GenerationRequest(PROMPT, width=512, height=512, frames=22), inventory, machine=m5)
    assert int8.dit_path == "int8" and dit_tracked(int8) < 21
    mlp_only = plan_memory(GenerationRequest(PROMPT, width=512, height=512, frames=22, slower_paths=frozenset(
        {SlowerPath.BF16_QKV, SlowerPath.BF16_ATTENTION_OUTPUT})), inventory, machine=m5)
    # README: int8 MLP "reducing measured peak tensor storage to 25.9 GiB from the BF16 path's 36.4 GiB"
    assert mlp_only.dit_path == "int8 MLP" and dit_tracked(mlp_only) == pytest.approx(25.9, abs=0.8)
    bf16 = plan_memory(GenerationRequest(PROMPT, width=512, height=512, frames=22,
                                         slower_paths=frozenset({SlowerPath.BF16_MLP, SlowerPath.BF16_QKV,
                                                                 SlowerPath.BF16_ATTENTION_OUTPUT})),
                       inventory, machine=m5)
    assert bf16.dit_path == "BF16"


def test_preview_is_dropped_before_anything_else(inventory) -> None:
    machine = MachineFacts(total_memory=19 * GIB, chip="Apple M2 Pro")      # 13 GiB usable
    plan = plan_memory(GenerationRequest(PROMPT, ssd_streaming=True, width=1344, height=768, frames=56),
                       inventory, machine=machine, preview=True)
    assert not plan.fits and plan.suggestion is not None
    assert plan.suggestion.changes == ("no live preview",) and not plan.suggestion.preview
    from h3bridge.cli.engine import cli_words
    assert plan.suggestion.settings == (Change("preview", False),)
    assert cli_words(plan.suggestion.settings) == "(omit --show)"


def test_suggestions_follow_the_cost_order(inventory) -> None:
    """The video decode is the peak here: fewer layers would not help, so they are left alone; the
    render canvas shrinks first, then as few frames are cut as needed."""
    machine = MachineFacts(total_memory=17 * GIB, chip="Apple M2")     # 11 GiB usable
    request = GenerationRequest(PROMPT, width=1344, height=768, frames=362, ssd_streaming=True)
    plan = plan_memory(request, inventory, machine=machine)
    assert not plan.fits and plan.peak_phase.name == "video decode" and plan.suggestion is not None
    changes = plan.suggestion.changes
    assert len(changes) == 2 and changes[0].startswith("render canvas") and changes[1].endswith(" frames")
    suggested = plan.suggestion.request
    assert suggested.layers == 50
    assert plan_memory(suggested, inventory, machine=machine).fits
    # minimal: one more legal frame (17 more) would not fit
    assert not plan_memory(suggested.with_changes(frames=suggested.frame_count + 17), inventory,
                           machine=machine).fits


def test_fewer_layers_suggested_when_they_suffice(inventory) -> None:
    plan = plan_memory(GenerationRequest(PROMPT, width=512, height=512, frames=22, int8_row_fc2=True),
                       inventory, machine=MachineFacts.mac(48))
    # 48 GiB: 38.4 GiB usable; BF16 at 50 layers fits already
    assert plan.fits
    tight = MachineFacts(total_memory=int(44 * GIB), chip="Apple M3 Max")      # 35.2 GiB usable
    plan = plan_memory(GenerationRequest(PROMPT, width=512, height=512, frames=22, ssd_streaming=False),
                       inventory, machine=tight)
    assert not plan.fits and plan.suggestion is not None
    assert plan.suggestion.changes == ("SSD streaming",)       # SSD first, even though 47 layers would fit
    no_ssd = plan_memory(GenerationRequest(PROMPT, width=512, height=512, frames=22, layers=47), inventory,
                         machine=tight)
    assert no_ssd.fits


def test_nothing_fits_a_tiny_machine(inventory) -> None:
    plan = plan_memory(GenerationRequest(PROMPT), inventory, machine=MachineFacts.mac(4))
    assert not plan.fits and plan.suggestion is None and "no smaller setting fits" in plan.verdict()


def test_geometry_follows_upstream_token_counts() -> None:
    assert [video_latent_t(f) for f in (22, 39, 56, 362)] == [7, 12, 17, 107]   # h3_host.c h3_video_latent_t
    g = geometry(GenerationRequest(PROMPT, width=864, height=480, frames=56))
    assert g.video_rows == 17 * 15 * 27 and g.audio_rows == 2 * 93          # llround(56 * 40 / 24) = 93
    rendered = geometry(GenerationRequest(PROMPT, width=864, height=480, render_width=576, render_height=320))
    assert rendered.video_rows == 17 * 10 * 18
    refs = geometry(GenerationRequest(PROMPT, references=(Reference(ReferenceKind.IMAGE, Path("a.png")),)))
    assert refs.condition_rows == 15 * 27


def test_ref2va_requests_use_the_ref2va_partition(inventory) -> None:
    request = GenerationRequest(PROMPT, references=(Reference(ReferenceKind.IMAGE, Path("a.png")),))
    plan = plan_memory(request, inventory, machine=M4_PRO_24)
    assert "Ref2VA" in plan.sizes.source
    assert plan.phase("reference encoding").total > PROCESS_BASE


def test_plan_without_model_uses_published_shapes() -> None:
    plan = plan_memory(GenerationRequest(PROMPT), None, machine=M4_PRO_24)
    assert "published" in plan.sizes.source and not plan.fits
    assert plan.to_dict()["suggestion"]["settings"] == [{"field": "ssd_streaming", "value": True}]
    from h3bridge.cli.main import plan_json
    assert plan_json(plan)["suggestion"]["flags"] == ["--ssd-streaming"]


def test_machine_detection_reads_psutil() -> None:
    import psutil
    facts = MachineFacts.detect()
    assert facts.total_memory == psutil.virtual_memory().total and facts.budget < facts.total_memory


# --- preflight


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_fixture_model(tmp_path / "tiny")


def test_preflight_passes_a_good_model_and_returns_the_plan(tiny: Path) -> None:
    plan = preflight(GenerationRequest(PROMPT), tiny, machine=M4_PRO_24)
    assert plan.fits and "tiny" in plan.sizes.source


def test_preflight_refuses_what_does_not_fit_unless_forced(realistic: Path) -> None:
    with pytest.raises(MemoryPlanError) as caught:
        preflight(GenerationRequest(PROMPT), realistic, machine=M4_PRO_24)
    assert caught.value.plan is not None and not caught.value.plan.fits
    # The library's hint is in Python's words; the CLI says the same fix as flags (issue 34.3).
    from h3bridge.cli.engine import cli_hint
    assert caught.value.hint == "use ssd_streaming=True (or pass force=True to try anyway)"
    assert "--ssd-streaming" in (cli_hint(caught.value) or "") and "--force" in (cli_hint(caught.value) or "")
    forced = preflight(GenerationRequest(PROMPT), realistic, machine=M4_PRO_24, force=True)
    assert not forced.fits


def test_preflight_raises_integrity_error_for_damaged_shard(tiny: Path) -> None:
    shard = sorted((tiny / "FL2VA/transformer").glob("*.safetensors"))[0]
    with open(shard, "r+b") as handle:
        handle.truncate(shard.stat().st_size - 2)
    with pytest.raises(IntegrityError):
        preflight(GenerationRequest(PROMPT), tiny, machine=M4_PRO_24)


def test_preflight_references_need_ref2va(tmp_path: Path) -> None:
    root = write_fixture_model(tmp_path / "noref", ref2va=False)
    request = GenerationRequest(PROMPT, references=(Reference(ReferenceKind.IMAGE, Path("a.png")),))
    with pytest.raises(ModelError, match="ordered references require the Ref2VA checkpoint"):
        preflight(request, root, machine=M4_PRO_24)


def test_preflight_layout_error(tiny: Path) -> None:
    shutil.rmtree(tiny / "FL2VA/audio_vae")
    with pytest.raises(ModelError, match="no safetensors files"):
        preflight(GenerationRequest(PROMPT), tiny, machine=M4_PRO_24)


# --- upstream's buffer arithmetic (h3_dit.c, h3_text_encoder.c), reference media, warm sessions


def write_video(path: Path, width: int, height: int, frames: int) -> Path:
    """A silent H.264 clip at 24 fps (PyAV)."""
    import av
    import numpy as np
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=24, options={"preset": "ultrafast"})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for index in range(frames):
            image = np.full((height, width, 3), index * 4 % 256, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def write_png(path: Path, width: int, height: int) -> Path:
    import av
    import numpy as np
    with av.open(str(path), "w", format="image2") as container:
        stream = container.add_stream("png")
        stream.width, stream.height, stream.pix_fmt = width, height, "rgb24"
        frame = av.VideoFrame.from_ndarray(np.zeros((height, width, 3), dtype=np.uint8), format="rgb24")
        for packet in [*stream.encode(frame), *stream.encode()]:
            container.mux(packet)
    return path


@pytest.fixture(scope="module")
def clip_1080p(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_video(tmp_path_factory.mktemp("media") / "ref1080.mp4", 1920, 1080, 60)   # 2.5 s


def test_dit_rows_cost_upstreams_activation_buffers(inventory) -> None:
    """h3_dit.c allocate_activations, per sequence row, from the released widths in the headers."""
    sizes = ModelSizes.from_inventory(inventory, "FL2VA")
    hidden, inner, ffn = sizes.dit_hidden, sizes.dit_inner, sizes.dit_ffn
    assert (hidden, inner, ffn) == (5376, 7168, 14336)
    bf16 = DitPath(ssd_streaming=False, int8_mlp=False, int8_qkv=False, int8_attention_output=False)
    base = dit_bytes_per_row(sizes, bf16)
    assert base == (3 * hidden + 6 * inner) * 2 == 118_272        # above the facts sheet's 96.8 KB
    int8 = DitPath(ssd_streaming=False, int8_mlp=True, int8_qkv=True, int8_attention_output=True)
    assert dit_bytes_per_row(sizes, int8) - base == ffn * 2 + ffn + ffn // 1024 * 4 == 43_064
    assert dit_bytes_per_row(sizes, bf16, core_reuse=2) - base == 2 * hidden * 2 == 21_504
    # int8 QKV/attention output without the int8 MLP: the int8 arena but no `activated`
    qkv_only = DitPath(ssd_streaming=False, int8_mlp=False, int8_qkv=True, int8_attention_output=True)
    assert dit_bytes_per_row(sizes, qkv_only) - base == ffn + ffn // 1024 * 4


def test_the_plan_counts_the_buffers_of_the_path_it_plans(inventory) -> None:
    request = GenerationRequest(PROMPT, width=512, height=512, frames=22)
    bf16 = plan_memory(request, inventory, machine=M4_PRO_24)
    sequence = geometry(request).sequence
    assert dict(bf16.phase("DiT load + denoise").parts)[f"activation arena ({sequence} rows)"] == sequence * 118_272
    # core reuse keeps two more HIDDEN-wide rows per sequence row for the run
    reused = plan_memory(request.with_changes(core_reuse=2), inventory, machine=M4_PRO_24)
    assert reused.peak - bf16.peak == sequence * 21_504
    # M5: int8 blocks, and the int8 buffers per row (padded to 128 rows)
    m5 = plan_memory(request, inventory, machine=MachineFacts.mac(128, "Apple M5 Max"))
    parts = dict(m5.phase("DiT load + denoise").parts)
    assert m5.dit_path == "int8" and parts["int8 MLP activations"] == sequence * 28_672
    assert parts["int8 activation arena"] == -(-sequence // 128) * 128 * 14_392


def test_m5_is_recognised_by_name_like_upstream() -> None:
    """h3_gpu.m: TensorOps (int8 DiT) and the 3-layer text ring need "M5" in the device name,
    not a generation number; H3_NAX=0 turns TensorOps (not the ring) off."""
    assert MachineFacts.mac(64, "Apple M5 Pro").int8_dit and MachineFacts.mac(64, "Apple M5").text_ring_depth == 3
    for other in ("Apple M6 Max", "Apple M4 Max", "Apple M3 Ultra"):
        assert not MachineFacts.mac(64, other).int8_dit and MachineFacts.mac(64, other).text_ring_depth == 2
    no_nax = MachineFacts(total_memory=64 * GIB, chip="Apple M5 Max", tensor_ops_disabled=True)
    assert not no_nax.int8_dit and no_nax.text_ring_depth == 3


def test_m5_plan_names_the_bf16_fallback(inventory) -> None:
    plan = plan_memory(GenerationRequest(PROMPT), inventory, machine=MachineFacts.mac(128, "Apple M5 Max"))
    bf16 = plan_memory(GenerationRequest(PROMPT), inventory,
                       machine=MachineFacts(128 * GIB, "Apple M5 Max", tensor_ops_disabled=True))
    assert plan.dit_path == "int8" and bf16.dit_path == "BF16" and bf16.peak > plan.peak
    assert any("runs BF16" in note and f"{bf16.peak / GIB:.1f} GiB" in note for note in plan.notes)


def test_upstream_canvas_functions() -> None:
    # h3_host.c h3_reference_video_canvas: 1080p -> the adapted 1344x768 (H3_MAX_PIXELS); a smaller
    # source keeps its size rounded to 32 (720 / 32 = 22.5 rounds to even: 704)
    assert reference_video_canvas(1920, 1080) == (1344, 768)
    assert reference_video_canvas(1080, 1920) == (768, 1344)
    assert reference_video_canvas(1280, 720) == (1280, 704)
    # h3_reference_image_canvas: match -> the render canvas's area; max -> a 2048 short edge
    assert reference_image_canvas(4000, 3000, 864, 480) == (736, 544)
    assert reference_image_canvas(4000, 3000, 864, 480, 2048) == (2720, 2048)
    assert reference_image_canvas(300, 200, 864, 480) == (288, 192)        # never scaled up


def test_reference_video_rows_follow_the_source_not_the_render_canvas(clip_1080p: Path) -> None:
    """h3.c h3_generate: a reference video is read at its own canvas (1344x768 for 1080p) for up to
    the clip's length, VAE-encoded (ceil(frames/4) latent frames) and shown to the vision tower in
    pairs of frames sampled every 12 (tokens join the text)."""
    reference = (Reference(ReferenceKind.SILENT_VIDEO, clip_1080p),)
    full = geometry(GenerationRequest(PROMPT, width=512, height=512, frames=56, references=reference))
    small = geometry(GenerationRequest(PROMPT, width=512, height=512, frames=56, render_width=256,
                                       render_height=256, references=reference))
    per_frame = (768 // 16) * (1344 // 16) // 4                           # 1008 rows per latent frame
    assert full.condition_rows == small.condition_rows == 14 * per_frame    # ceil(56 / 4) = 14
    assert full.vision_tokens == small.vision_tokens == 3 * per_frame      # ceil(ceil(56/12) / 2) = 3 pairs
    assert full.video_rows == 17 * 16 * 16 and small.video_rows == 17 * 8 * 8
    assert full.text_rows > full.vision_tokens
    # the clip is 60 frames at 24 fps: a 107-frame request reads 56 of them (5 + 17n)
    longer = geometry(GenerationRequest(PROMPT, width=512, height=512, frames=107, references=reference))
    assert longer.condition_rows == full.condition_rows


def test_three_1080p_reference_videos_need_ssd_streaming_on_a_32_gb_m5(inventory, clip_1080p: Path) -> None:
    """The review's example: ~57k sequence rows, not ~19k; 18.9k rows fitted a 32 GB M5."""
    references = tuple(Reference(ReferenceKind.SILENT_VIDEO, clip_1080p) for _ in range(3))
    request = GenerationRequest(PROMPT, width=512, height=512, frames=56, references=references)
    assert geometry(request).sequence > 55_000
    plan = plan_memory(request, inventory, machine=MachineFacts.mac(32, "Apple M5"))
    assert plan.peak_phase.name == "DiT load + denoise" and not plan.fits and plan.needs_ssd_streaming


def test_reference_image_size_max_reads_the_image(tmp_path: Path) -> None:
    image = write_png(tmp_path / "photo.png", 3000, 2000)
    match = geometry(GenerationRequest(PROMPT, references=(Reference(ReferenceKind.IMAGE, image),)))
    assert match.condition_rows == match.vision_tokens == (512 // 32) * (800 // 32)      # 800x512
    biggest = geometry(GenerationRequest(PROMPT, references=(Reference(ReferenceKind.IMAGE, image),),
                                         reference_image_size=ReferenceImageSize.MAX))
    assert biggest.condition_rows == biggest.vision_tokens == (1984 // 32) * (3008 // 32)   # 3008x1984


def test_unreadable_reference_is_planned_at_upstreams_largest(inventory, tmp_path: Path) -> None:
    request = GenerationRequest(PROMPT, width=512, height=512, frames=56,
                                references=(Reference(ReferenceKind.SILENT_VIDEO, tmp_path / "gone.mp4"),))
    assert geometry(request).condition_rows == 14 * 1008                  # 1344x768, the whole clip
    plan = plan_memory(request, inventory, machine=MachineFacts.mac(128))
    assert any("could not be read" in note and "1344x768" in note for note in plan.notes)


def test_anchor_pictures_are_encoded_as_text_tokens(inventory) -> None:
    """FL2VA anchors go through the vision tower too (h3.c l.1338-1350): (W/32)(H/32) picture tokens
    each, which the text encoder runs over (h3_text_encoder.c l.577-603, with deepstack rows)."""
    plain = GenerationRequest(PROMPT, width=864, height=480)
    anchored = plain.with_changes(first_frame=Path("first.png"), last_frame=Path("last.png"))
    g = geometry(anchored)
    assert g.vision_tokens == 2 * 15 * 27 and g.condition_rows == 2 * 15 * 27
    assert g.text_rows - geometry(plain).text_rows > g.vision_tokens
    sizes = ModelSizes.from_inventory(inventory, "FL2VA")
    assert text_token_bytes(sizes, pictures=False) == 4 + 512 + (4 * 5120 + 2 * 8192 + 2 * 1024 + 2 * 25600) * 2 \
        + 5120 * 2
    before = plan_memory(plain, inventory, machine=M4_PRO_24).phase("prompt encoding")
    after = plan_memory(anchored, inventory, machine=M4_PRO_24).phase("prompt encoding")
    assert after.total - before.total >= g.vision_tokens * text_token_bytes(sizes, pictures=True)


def test_a_warm_session_keeps_the_dit_and_the_decoder(inventory) -> None:
    """h3's interactive mode retains the DiT next to the video decoder, and the decoder through
    the next clip's DiT load: the review's 48 GB example fits one-shot, not as a session."""
    machine = MachineFacts.mac(48, "Apple M4 Pro")
    request = GenerationRequest(PROMPT)
    one_shot = plan_memory(request, inventory, machine=machine)
    session = plan_memory(request, inventory, machine=machine, session=True)
    assert one_shot.fits and not session.fits and session.needs_ssd_streaming
    decoder = one_shot.phase("video decode")
    decoder_bytes = dict(decoder.parts)["video VAE decoder"] + dict(decoder.parts)["tile workspace"]
    dit = one_shot.phase("DiT load + denoise")
    assert session.phase("DiT load + denoise").total - dit.total >= decoder_bytes
    # BF16 (no quantization transient): the retained DiT is the DiT phase without the process and
    # the host copy of its inputs (freed after the load, h3.c:1533-1537)
    retained = dit.total - PROCESS_BASE - dict(dit.parts)["text embedding + condition rows until loaded"]
    assert dict(session.phase("video decode").parts)["retained DiT"] == retained
    assert session.phase("video decode").total - decoder.total >= retained
    assert session.peak > one_shot.peak + 9 * GIB and session.to_dict()["session"] is True
    assert "warm session" in session.render()


def test_session_mode_reaches_generate_plan_and_comfyui(realistic: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from h3bridge.cli.main import main
    from h3bridge.comfy import adapter
    args = ["plan", "-d", str(realistic), "--memory-gb", "48", "--chip", "Apple M4 Pro"]
    assert main(args) == 0
    assert main([*args, "--engine", "session"]) == 1 and "warm session" in capsys.readouterr().out
    request = GenerationRequest(PROMPT)
    machine = MachineFacts.mac(48, "Apple M4 Pro")
    assert adapter.decide_ssd_streaming("auto", request, realistic, machine=machine)[0] is False
    ssd, plan = adapter.decide_ssd_streaming("auto", request, realistic, machine=machine, session=True)
    assert ssd is True and plan.session and plan.fits
    monkeypatch.setattr(MachineFacts, "detect", classmethod(lambda cls: machine))
    preflight(request, realistic)
    with pytest.raises(MemoryPlanError):
        preflight(request, realistic, session=True)


@pytest.mark.parametrize(("chip", "expected"), [("Apple M4 Pro", "needs --ssd-streaming"),
                                                ("Apple M5", "fits without --ssd-streaming")])
def test_doctor_memory_advice_comes_from_the_plan(monkeypatch: pytest.MonkeyPatch, chip: str, expected: str) -> None:
    """A 32 GB M5 runs the default request without SSD streaming (int8 DiT); a 32 GB M4 Pro does not."""
    from h3bridge.cli.main import default_request_advice
    monkeypatch.setattr(MachineFacts, "detect", classmethod(lambda cls: MachineFacts.mac(32, chip)))
    assert expected in default_request_advice()


def test_a_plan_reads_the_requests_geometry_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """geometry() probes a request's reference media; plan_memory and the plan's table read it
    once (issue 34: three times per plan)."""
    from h3bridge.model import memory
    calls: list[object] = []
    real = memory.geometry
    # plan_memory and the plan's table live in memory/plan.py (issue 34.3): patched where they look it up
    monkeypatch.setattr(memory.plan, "geometry", lambda request: calls.append(request) or real(request))
    plan = memory.plan_memory(GenerationRequest("a fox"), machine=MachineFacts.mac(128, "Apple M4 Max"))
    table = plan.render()
    assert plan.fits and "sequence" in table
    assert len(calls) == 1
