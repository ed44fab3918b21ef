"""geometry.py against upstream's own C: the functions are compiled from h3.c's pinned source
(8974cc0) and called for every input, so the Python rule is checked against upstream's code,
not against a second reading of it. Skipped without the source or a C compiler."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from upstream_helpers import upstream_source_file
from h3bridge.geometry import video_encoder_latent_t, video_latent_t



def upstream_file(name: str) -> str | None:
    """One file of h3.c from $H3_UPSTREAM_SOURCE; None without it."""
    data = upstream_source_file(name)
    return data.decode("utf-8") if data is not None else None


def upstream_function(source: str, name: str) -> str:
    """The text of one top-level C function (signature to its closing brace at column 0)."""
    match = re.search(r"^int " + re.escape(name) + r"\(int frame_count\) \{\n.*?^\}\n", source, re.M | re.S)
    assert match is not None, f"{name} not found in h3_host.c: has upstream changed its shape?"
    return match.group(0)


@pytest.fixture(scope="module")
def upstream_values(tmp_path_factory) -> dict[str, list[int]]:
    """Upstream's h3_video_latent_t and h3_video_encoder_latent_t for F in 0..400, compiled from
    its source with this machine's C compiler (both are pure integer C)."""
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    source = upstream_file("h3_host.c")
    if compiler is None or source is None:
        pytest.skip("needs h3.c's source (8974cc0) and a C compiler")
    names = ("h3_video_latent_t", "h3_video_encoder_latent_t")
    folder = tmp_path_factory.mktemp("upstream_geometry")
    program = folder / "geometry.c"
    program.write_text("#include <stdio.h>\n" + "".join(upstream_function(source, n) for n in names)
                       + "int main(void) {\n    for (int f = 0; f <= 400; f++) {\n"
                       + "".join(f'        printf("{n} %d\\n", {n}(f));\n' for n in names) + "    }\n    return 0;\n}\n")
    built = subprocess.run([compiler, "-O0", "-o", str(folder / "geometry"), str(program)],
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    output = subprocess.run([str(folder / "geometry")], capture_output=True, text=True, timeout=60, check=True).stdout
    values: dict[str, list[int]] = {n: [] for n in names}
    for line in output.splitlines():
        name, value = line.split()
        values[name].append(int(value))
    assert all(len(v) == 401 for v in values.values())
    return values


def test_video_latent_t_is_upstreams_for_every_frame_count(upstream_values):
    ours = [video_latent_t(f) for f in range(401)]
    assert ours == upstream_values["h3_video_latent_t"]


def test_video_encoder_latent_t_is_upstreams_for_every_frame_count(upstream_values):
    ours = [video_encoder_latent_t(f) for f in range(401)]
    assert ours == upstream_values["h3_video_encoder_latent_t"]
