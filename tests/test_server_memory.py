"""Memory a client can make `h3bridge serve` spend (issue 19 item 5), measured on the server
process as bench/bench_serve_memory.py measures it (its peak RSS while one request is handled),
at sizes that keep the test short. The bounds are generous: each attack cost the old server
several times its bound (a 5000x4000 PNG about 120 MiB, a 100 MiB JSON body about 300 MiB)."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import httpx
import pytest

from h3bridge.request import MAX_PROMPT_BYTES
from h3bridge.wire.videos import LISTED_PROMPT_CHARS

from core_helpers import make_image
from server_helpers import ServerProcess, isolated_env, model  # noqa: F401  (model: a fixture)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_serve_memory import MiB, TINY, json_body_attack, measure, picture_attack  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model: Path):  # noqa: F811
    root = tmp_path_factory.mktemp("serve-memory")
    with ServerProcess(root / "data", model, root / "logs", env=isolated_env(root)) as process:
        yield process


def test_a_picture_declaring_millions_of_pixels_is_refused_without_decoding_it(server: ServerProcess,
                                                                              tmp_path: Path) -> None:
    if shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg is not installed")
    picture = make_image(tmp_path / "big.png", size="5000x4000")
    result = measure(server, "two PNGs declaring 5000x4000", picture_attack(picture, 2))
    print(result.line())
    assert all(answer.startswith("400 [first_frame]") and "5000x4000" in answer for answer in result.answers), \
        result.answers
    assert result.grown < 50 * MiB, result.line()


def test_a_json_body_is_read_only_up_to_its_cap(server: ServerProcess) -> None:
    result = measure(server, "JSON body of 100 MiB", json_body_attack(100))
    print(result.line())
    assert result.answers[0].startswith("400") and "32 MiB" in result.answers[0], result.answers
    assert result.grown < 80 * MiB, result.line()


def test_long_prompts_are_refused_and_lists_repeat_only_their_start(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {server.env['H3BRIDGE_API_KEY']}"},
                      timeout=120) as client:
        too_long = client.post("/videos", json={"prompt": "a" * MiB} | TINY)
        assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "prompt", too_long.text[:300]
        for _ in range(3):
            accepted = client.post("/videos", json={"prompt": "a fox " * (MAX_PROMPT_BYTES // 6)} | TINY)
            assert accepted.status_code == 200, accepted.text[:300]
        page = client.get("/videos", params={"limit": 100})
    assert page.status_code == 200
    assert all(len(job["prompt"]) <= LISTED_PROMPT_CHARS for job in page.json()["data"])
    assert len(page.content) < 3 * (LISTED_PROMPT_CHARS * 4 + 1024), len(page.content)
