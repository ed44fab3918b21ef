"""A bounded, deterministic sample of the differential checks (bench/differential.py): a few
cases of every category (CLI arguments, validation, damaged models, environment, renders,
interactive sessions, C-API calls) run on h3-sim / the libh3 double and on upstream h3.c's own
code built here, and must agree, aspect by aspect, except where the C library explains it
(bench/differential.py platform_reason and GETOPT_LINES: h3-sim mirrors macOS libc, the Linux
build links glibc). Skipped without H3_UPSTREAM_SOURCE (tests/upstream_helpers.py). The full
run and its agreement figures: bench/differential.py."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from upstream_helpers import upstream_engine  # noqa: F401  (fixture)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import differential  # noqa: E402
from differential_cases import build_workspace, generate_cases  # noqa: E402

CASES_PER_CATEGORY = 5


@pytest.fixture(scope="module")
def observed(upstream_engine, tmp_path_factory: pytest.TempPathFactory):  # noqa: F811
    cases = differential.sample_cases(generate_cases(22), CASES_PER_CATEGORY)
    root = tmp_path_factory.mktemp("differential")
    workspace = build_workspace(root / "workspace").resolve()
    sides = [differential.Side.sim(),
             differential.Side.upstream(str(upstream_engine.program), str(upstream_engine.library))]
    runs = root / "runs"
    runs.mkdir()
    return cases, differential.run_all(cases, sides, workspace, runs, jobs=2, timeout=240,
                                       progress=False)


def test_the_sample_covers_every_category(observed) -> None:
    cases, _ = observed
    categories = {case["category"] for case in cases}
    assert categories == {"cli-args", "cli-validate", "cli-model", "cli-env", "cli-render",
                          "session", "capi"}
    assert len(cases) == CASES_PER_CATEGORY * len(categories)


def test_h3_sim_and_the_double_agree_with_upstream(observed) -> None:
    cases, results = observed
    differing = {}
    for case in cases:
        key = str(case["id"])
        sim, upstream = results["sim"][key], results["upstream"][key]
        aspects = differential.differing_aspects(sim, upstream)
        if aspects and differential.platform_reason(sim, upstream) is None:
            differing[key] = {aspect: (sim.get(aspect), upstream.get(aspect)) for aspect in aspects}
    assert not differing, differing


def _cache_bytes(side: differential.Side, workspace: Path, runs: Path) -> list[object]:
    """h3_cache_get_info after a T2VA job (an added token inside the prompt), an FL2VA job with
    both anchors, and a Ref2VA job with an image, a video with its sound and an audio clip."""
    tiny = {"width": 64, "height": 32, "frames": 22, "steps": 2}
    case = {"id": "cache-bytes", "category": "capi", "kind": "capi", "model": "ok", "env": {},
            "ops": [{"op": "cache_set", "enabled": 1},
                    {"op": "generate", "prompt": "a fox Ünï <|im_end|>x", "params": tiny},
                    {"op": "cache_info"},
                    {"op": "generate", "prompt": "a fox", "params": {
                        **tiny, "height": 64, "first_frame": "red.png", "last_frame": "blue.jpg"}},
                    {"op": "cache_info"},
                    {"op": "generate", "prompt": "a fox", "params": {**tiny, "frames": 56},
                     "refs": [["image", "red.png"], ["video", "clip.mp4", 1], ["audio", "tone.wav"]]},
                    {"op": "cache_info"}]}
    observation = differential.run_case(side, case, workspace, runs, 600, workspace / "h3_shaders.metal")
    return [call for call in observation["calls"] if call["op"] == "cache_info"]


def test_the_cached_conditioning_has_upstreams_size(upstream_engine, tmp_path: Path) -> None:  # noqa: F811
    """The double's h3_cache_get_info counts upstream's token rows: the prompt's ids and the
    multimodal presentation's labels and vision spans (h3-sim once guessed 24 + bytes/4 + 256
    per image, 14x too many for a 64x32 job)."""
    workspace = build_workspace(tmp_path / "workspace").resolve()
    (workspace / "h3_shaders.metal").write_bytes(
        Path(upstream_engine.program).with_name("h3_shaders.metal").read_bytes())
    (tmp_path / "runs").mkdir()
    upstream = differential.Side.upstream(str(upstream_engine.program), str(upstream_engine.library))
    expected = _cache_bytes(upstream, workspace, tmp_path / "runs")
    assert len(expected) == 3 and all(info["entries"] == 1 for info in expected)
    assert _cache_bytes(differential.Side.sim(), workspace, tmp_path / "runs") == expected


@pytest.mark.parametrize("env", [{"H3_PROFILE": "0"}, {"H3_PROFILE": "1", "H3_CPU_SAMPLER": "1"},
                                 {"H3_PROFILE": "", "H3_GPU_SAMPLER_WINDOW": "0"}],
                         ids=["gpu-profile-0", "cpu-profile-1", "gpu-empty-unbounded"])
def test_the_samplers_profile_lines_are_upstreams(env: dict[str, str], upstream_engine,  # noqa: F811
                                                  tmp_path: Path) -> None:
    """h3_dit.c prints the reuse schedule's size and the GPU sampler's encode window whenever
    H3_PROFILE is set at all ("0" and "" too), unlike the "h3 profile:" lines."""
    workspace = build_workspace(tmp_path / "workspace").resolve()
    shaders = workspace / "h3_shaders.metal"
    shaders.write_bytes(Path(upstream_engine.program).with_name("h3_shaders.metal").read_bytes())
    (tmp_path / "runs").mkdir()
    case = {"id": "sampler-lines", "category": "cli-env", "kind": "cli", "env": env, "stdin": "",
            "args": ["-d", "{MODEL:ok}", "-p", "a fox", "--width", "64", "--height", "32",
                     "--frames", "22", "--steps", "4", "--reuse", "2", "-o", "{CASE}/out.mp4"]}
    upstream = differential.run_case(
        differential.Side.upstream(str(upstream_engine.program), str(upstream_engine.library)),
        case, workspace, tmp_path / "runs", 600, shaders)
    sim = differential.run_case(differential.Side.sim(), case, workspace, tmp_path / "runs", 600, shaders)
    assert upstream["status"] == 0 and any("reuse schedule has 3 evaluations" in line
                                           for line in upstream["messages"])
    assert differential.differing_aspects(sim, upstream) == []
