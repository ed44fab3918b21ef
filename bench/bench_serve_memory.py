"""Memory a client can make `h3bridge serve` spend: the server's peak RSS per hostile request.

    python bench/bench_serve_memory.py [--picture-side 16000] [--json-mib 300] [--prompt-mib 50]

Starts `h3bridge serve` over h3-sim and a fixture model (tests/server_helpers.ServerProcess), a
fresh one for each attack so each starts from the same baseline, and prints, per attack, the
server's RSS just before it (psutil), its peak while the request is handled, the growth, and the
HTTP answer. The peak is Linux's VmHWM, reset before the request through /proc/PID/clear_refs,
and, on any system, the highest of psutil samples taken every 2 ms.

Attacks (issue 19 item 5): a PNG declaring SIDExSIDE pixels as the first frame (the campaign's:
0.71 MiB declaring 16000x16000), four of them at once, a JSON body of --json-mib MiB (sent with
no Content-Length, so the server must count), a JSON prompt of --prompt-mib MiB, and the job list
(limit=100) after three jobs with the longest prompt each server accepted. tests/test_server_memory.py
runs small versions and asserts bounds.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from server_helpers import KEY, ServerProcess, isolated_env  # noqa: E402  (the tests' launcher)

MiB = 1024 * 1024
HEADERS = {"Authorization": f"Bearer {KEY}"}
TINY = {"size": "96x64", "num_frames": 22, "num_inference_steps": 2}


class PeakRss:
    """The peak RSS of process `pid` while the `with` block runs (bytes)."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.pid = pid
        self.before = 0
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _hwm(self) -> int | None:
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return None

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, self.process.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.002)

    def __enter__(self) -> "PeakRss":
        self.before = self.process.memory_info().rss
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")    # VmHWM := the current RSS
        except OSError:
            pass
        self.peak = self.before
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.peak = max(self.peak, self._hwm() or 0, self.process.memory_info().rss)

    @property
    def grown(self) -> int:
        return self.peak - self.before


@dataclass
class Measured:
    attack: str
    before: int
    peak: int
    answers: list[str]

    @property
    def grown(self) -> int:
        return self.peak - self.before

    def line(self) -> str:
        return (f"{self.attack:<44} RSS before {self.before / MiB:7.1f} MiB, peak {self.peak / MiB:7.1f} MiB, "
                f"grew {self.grown / MiB:7.1f} MiB   -> {', '.join(self.answers)}")


def describe(response: httpx.Response) -> str:
    if response.status_code == 200:
        return f"200 ({len(response.content) / MiB:.2f} MiB body)"
    try:
        error = response.json()["error"]
        return f"{response.status_code} [{error.get('param')}] {error['message'][:90]}"
    except (ValueError, KeyError, TypeError):
        return f"{response.status_code} {response.text[:90]!r}"


def measure(server: ServerProcess, attack: str, send: Callable[[httpx.Client], list[httpx.Response]]) -> Measured:
    assert server.process is not None
    with httpx.Client(base_url=server.api, headers=HEADERS, timeout=600) as client:
        with PeakRss(server.process.pid) as peak:
            responses = send(client)
    return Measured(attack, peak.before, peak.peak, [describe(r) for r in responses])


def make_picture(path: Path, side: int) -> Path:
    """A black PNG of side x side (PyAV's png encoder; 16000 makes the campaign's 0.7 MiB file)."""
    import av
    import numpy as np
    with av.open(str(path), "w", format="image2") as container:
        stream = container.add_stream("png")
        stream.width, stream.height, stream.pix_fmt = side, side, "rgb24"
        frame = av.VideoFrame.from_ndarray(np.zeros((side, side, 3), np.uint8), format="rgb24")
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return path


def picture_attack(picture: Path, copies: int) -> Callable[[httpx.Client], list[httpx.Response]]:
    def send(client: httpx.Client) -> list[httpx.Response]:
        def one(_: int) -> httpx.Response:
            return client.post("/videos", data={"prompt": "a fox", "size": "96x64", "num_frames": "22",
                                                "num_inference_steps": "2"},
                               files={"input_reference": (picture.name, picture.read_bytes(), "image/png")})
        with ThreadPoolExecutor(copies) as pool:
            return list(pool.map(one, range(copies)))
    return send


def json_body_attack(mib: int) -> Callable[[httpx.Client], list[httpx.Response]]:
    """A JSON body of `mib` MiB (a prompt that long), streamed without a Content-Length."""
    def chunks() -> Iterator[bytes]:
        yield b'{"prompt": "'
        block = b"a" * MiB
        for _ in range(mib):
            yield block
        yield b'", "size": "96x64", "num_frames": 22}'

    def send(client: httpx.Client) -> list[httpx.Response]:
        try:
            return [client.post("/videos", content=chunks(), headers={"content-type": "application/json"})]
        except httpx.TransportError as error:       # a server may answer and close before it all went
            return [httpx.Response(599, text=f"connection ended: {error}")]
    return send


def prompt_attack(mib: float) -> Callable[[httpx.Client], list[httpx.Response]]:
    def send(client: httpx.Client) -> list[httpx.Response]:
        try:
            return [client.post("/videos", json={"prompt": "a" * int(mib * MiB)} | TINY)]
        except httpx.TransportError as error:
            return [httpx.Response(599, text=f"connection ended: {error}")]
    return send


def longest_accepted_prompt(client: httpx.Client, wanted: int) -> tuple[int, list[str]]:
    """Submit jobs with prompts of `wanted` bytes, halving until the server accepts one; three jobs."""
    size, accepted = wanted, []
    while size >= 1024 and len(accepted) < 3:
        response = client.post("/videos", json={"prompt": "a" * size} | TINY)
        if response.status_code == 200:
            accepted.append(response.json()["id"])
        else:
            size //= 2
    return size, accepted


def run(picture_side: int, json_mib: int, prompt_mib: float, workdir: Path, model: Path,
        only: set[str] | None = None) -> list[Measured]:
    picture = None
    if only is None or {"picture", "pictures"} & only:
        picture = make_picture(workdir / f"declares-{picture_side}.png", picture_side)
        print(f"{picture.name}: {picture.stat().st_size / MiB:.2f} MiB", file=sys.stderr)
    attacks: dict[str, Callable[[httpx.Client], list[httpx.Response]]] = {}
    if picture is not None:
        attacks["picture"] = picture_attack(picture, 1)
        attacks["pictures"] = picture_attack(picture, 4)
    attacks["json"] = json_body_attack(json_mib)
    attacks["prompt"] = prompt_attack(prompt_mib)
    names = {"picture": f"PNG declaring {picture_side}x{picture_side}",
             "pictures": f"4 PNGs declaring {picture_side}x{picture_side} at once",
             "json": f"JSON body of {json_mib} MiB (no Content-Length)",
             "prompt": f"JSON prompt of {prompt_mib:g} MiB", "list": "GET /v1/videos?limit=100 after 3 long prompts"}
    results = []
    for index, key in enumerate([*attacks, "list"]):
        if only is not None and key not in only:
            continue
        root = workdir / f"server-{index}"
        with ServerProcess(root / "data", model, root / "logs", env=isolated_env(root)) as server:
            if key == "list":
                with httpx.Client(base_url=server.api, headers=HEADERS, timeout=600) as client:
                    size, accepted = longest_accepted_prompt(client, int(prompt_mib * MiB))
                names[key] += f" ({len(accepted)} of {size / 1024:.0f} KiB)"
                result = measure(server, names[key], lambda client: [client.get("/videos", params={"limit": 100})])
            else:
                result = measure(server, names[key], attacks[key])
        results.append(result)
        print(result.line(), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--picture-side", type=int, default=16000)
    parser.add_argument("--json-mib", type=int, default=300)
    parser.add_argument("--prompt-mib", type=float, default=50)
    parser.add_argument("--only", action="append", choices=["picture", "pictures", "json", "prompt", "list"])
    args = parser.parse_args()
    from h3bridge.sim.fixture import write_fixture_model
    with tempfile.TemporaryDirectory(prefix="bench-serve-memory-") as temporary:
        workdir = Path(temporary)
        model = write_fixture_model(workdir / "model" / "MiniMax-H3")
        run(args.picture_side, args.json_mib, args.prompt_mib, workdir, model,
            set(args.only) if args.only else None)


if __name__ == "__main__":
    main()
