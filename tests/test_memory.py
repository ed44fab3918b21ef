"""Memory planner: reproduces upstream's published figures and picks the least costly fix."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from h3bridge.errors import IntegrityError, MemoryPlanError, ModelError
from h3bridge.memory import (
    GIB,
    PROCESS_BASE,
    MachineFacts,
    ModelSizes,
    geometry,
    plan_memory,
    preflight,
    video_latent_t,
)
from h3bridge.model import inspect_model
from h3bridge.request import GenerationRequest, Reference, ReferenceKind, SlowerPath
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
    """The DiT phase without the process baseline: upstream's 'tracked DiT storage' (GiB)."""
    return (plan.phase("DiT load + denoise").total - PROCESS_BASE) / GIB


def test_published_shapes_match_the_realistic_inventory(inventory) -> None:
    from_inventory = ModelSizes.from_inventory(inventory, "FL2VA")
    published = ModelSizes.published()
    assert from_inventory.dit_block_matrices == published.dit_block_matrices
    assert from_inventory.dit_block_int8 == published.dit_block_int8
    assert from_inventory.text_layer == published.text_layer
    assert from_inventory.adaln_row_bytes == published.adaln_row_bytes
    assert from_inventory.dit_blocks == 50 and from_inventory.text_layers_used == 50


def test_full_residency_reproduces_readme_tracked_dit_storage(inventory) -> None:
    # README: "the BF16 path's 36.4 GiB" (512 square), "about 36.5 GiB" before SSD streaming
    plan = plan_memory(GenerationRequest(PROMPT, width=512, height=512, frames=22), inventory, machine=M4_PRO_24)
    assert plan.dit_path == "BF16"
    assert dit_tracked(plan) == pytest.approx(36.45, abs=0.1)


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
    assert plan.suggestion.flags == ("--ssd-streaming",)
    assert "does not fit" in plan.verdict() and "--ssd-streaming" in plan.verdict()


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
    assert plan.suggestion.flags == ("(omit --show)",)


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
    assert plan.to_dict()["suggestion"]["flags"] == ["--ssd-streaming"]


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
    assert "--ssd-streaming" in (caught.value.hint or "") and "--force" in (caught.value.hint or "")
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
