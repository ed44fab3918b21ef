"""The sdist and the wheel as `python -m build` makes them (issue 30 item 4).

The sdist is what `pip install SDIST` and then `python -m pytest` in the unpacked folder start
from, so it must hold every file of the repository the suite, ComfyUI or the docs read (checked
against `git ls-files` when this runs from a checkout; an unpacked sdist has no .git, and that
check is skipped there). The wheel must carry everything ComfyUI loads from the package besides
Python (the frontend scripts, the locale files and the Chinese strings), found by an installed
copy without any checkout: a fresh virtual environment gets only the wheel, and
`h3bridge.comfy` there must find its web folder and locale strings inside itself.

Both are built once for the module, from a copy of the sources in a temporary folder (a build
writes its egg-info beside the sources: never into the checkout).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REPO_DOCS = ROOT / "docs"
# Build leftovers and local environments: in a folder, never part of the sources.
NOT_SOURCES = (".git", ".venv*", "__pycache__", "*.py[cod]", "*.egg-info", "build", "dist", ".pytest_cache",
               ".hypothesis", ".differential")
# What ComfyUI loads from h3bridge/comfy besides Python (h3bridge/comfy/__init__.py).
COMFY_DATA = ("web/h3_prompt_labels.js", "locales/en/nodeDefs.json", "locales/en/main.json",
              "locales/zh/nodeDefs.json", "locales/zh/main.json", "zh_strings.json")


def tracked_files() -> list[str] | None:
    """`git ls-files` of the checkout this runs from; None from an unpacked sdist (no .git)."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        return None
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True,
                            timeout=60).stdout.decode()
    return [name for name in listed.split("\0") if name]


def copy_sources(target: Path) -> None:
    """The sources as a fresh clone has them: the tracked files from a checkout (links kept as
    links), else this unpacked sdist without build leftovers."""
    tracked = tracked_files()
    if tracked is None:
        shutil.copytree(ROOT, target, symlinks=True, ignore=shutil.ignore_patterns(*NOT_SOURCES))
        return
    for name in tracked:
        source, copy = ROOT / name, target / name
        if not source.exists() and not source.is_symlink():
            continue            # deleted in the work tree and not yet committed
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, copy, follow_symlinks=False)


def files_under(folder: Path) -> set[str]:
    """Every file below `folder` (through links to folders), relative, without build leftovers."""
    found = set()
    for directory, subfolders, files in os.walk(folder, followlinks=True):
        subfolders[:] = [d for d in subfolders if d != "__pycache__"]
        for name in files:
            if not name.endswith((".pyc", ".pyo")):
                found.add((Path(directory) / name).relative_to(folder).as_posix())
    return found


@dataclass(frozen=True)
class Built:
    sources: Path
    sdist: Path
    wheel: Path
    output: str             # what the build frontend and the backend printed

    def sdist_names(self) -> set[str]:
        """The sdist's files, without its top folder (h3bridge-VERSION/)."""
        with tarfile.open(self.sdist) as archive:
            return {member.name.split("/", 1)[1] for member in archive.getmembers()
                    if member.isfile() and "/" in member.name}

    def wheel_names(self) -> set[str]:
        with zipfile.ZipFile(self.wheel) as archive:
            return {name for name in archive.namelist() if not name.endswith("/")}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """`python -m build`: the sdist from the sources, then the wheel from that sdist (so a file
    the sdist lacks fails the wheel too), each in an isolated environment with the setuptools
    pyproject.toml asks for."""
    pytest.importorskip("build", reason="the build frontend: pip install -e '.[test]'")
    folder = tmp_path_factory.mktemp("package-build")
    sources, dist = folder / "sources", folder / "dist"
    copy_sources(sources)
    done = subprocess.run([sys.executable, "-m", "build", "--outdir", str(dist), str(sources)],
                          capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    if done.returncode != 0 and re.search(r"Could not find a version|No matching distribution|"
                                          r"Failed to establish|Network is unreachable", output):
        pytest.skip("pip could not fetch the build backend (no package index here)")
    assert done.returncode == 0, output[-4000:]
    return Built(sources, next(dist.glob("h3bridge-*.tar.gz")), next(dist.glob("h3bridge-*.whl")), output)


@pytest.mark.slow
def test_the_sdist_holds_every_tracked_file(built: Built) -> None:
    """`pip install SDIST` + `python -m pytest` in the unpacked folder: the suite's helpers,
    conftest.py and fixtures, the docs it runs, bench/, bin/h3-sim, the root __init__.py
    (ComfyUI's entry point) and __main__.py, the locales, the web scripts, the example workflows.
    A tracked link to a folder is there as the folder's files."""
    tracked = tracked_files()
    if tracked is None:
        pytest.skip("not a git checkout (an unpacked sdist): nothing to compare the sdist with")
    expected = set()
    for name in tracked:
        path = ROOT / name
        if path.is_dir():                      # a tracked link to a folder (h3bridge/comfy/locales)
            expected |= {f"{name}/{inner}" for inner in files_under(path)}
        elif path.exists():
            expected.add(name)
    names = built.sdist_names()
    missing = sorted(expected - names)
    assert not missing, f"tracked files missing from the sdist (MANIFEST.in): {missing}"
    for needed in ("tests/conftest.py", "tests/fixtures", "docs/python-api.md", "bench/differential.py",
                   "bin/h3-sim", "__init__.py", "__main__.py", "README.zh-CN.md", "requirements.txt",
                   "h3bridge/comfy/web/h3_prompt_labels.js", "locales/zh/nodeDefs.json", "icon.svg",
                   "example_workflows/h3_text_to_video_audio.json"):
        assert any(name == needed or name.startswith(needed + "/") for name in names), needed


@pytest.mark.slow
def test_the_sdist_holds_no_build_leftovers(built: Built) -> None:
    leftovers = sorted(name for name in built.sdist_names()
                       if re.search(r"(^|/)(__pycache__|\.venv[^/]*|\.git|build|dist)/|\.py[co]$", name))
    assert not leftovers, leftovers


@pytest.mark.slow
def test_the_wheel_carries_every_file_of_the_package(built: Built) -> None:
    """Everything under h3bridge/ in the sources, Python or not (the web scripts, the locale files
    through their link, the Chinese strings, the C sources h3-sim-lib and build-engine compile)."""
    expected = {f"h3bridge/{name}" for name in files_under(built.sources / "h3bridge")}
    names = built.wheel_names()
    missing = sorted(expected - names)
    assert not missing, f"package files missing from the wheel (pyproject.toml package-data): {missing}"
    assert {f"h3bridge/comfy/{name}" for name in COMFY_DATA} <= names
    for language in ("en", "zh"):
        for page in ("main.json", "nodeDefs.json"):
            with zipfile.ZipFile(built.wheel) as archive:
                carried = archive.read(f"h3bridge/comfy/locales/{language}/{page}")
            assert carried == (built.sources / "locales" / language / page).read_bytes(), (language, page)


@pytest.fixture(scope="module")
def wheel_venv(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with only the wheel installed (no dependencies: none of the
    reads below needs one); its python."""
    venv = tmp_path_factory.mktemp("wheel-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                              "--no-deps", "--no-index", "--disable-pip-version-check", str(built.wheel)],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]
    return python


def outside_any_venv() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


@pytest.mark.slow
def test_an_installed_wheel_finds_its_web_folder_and_locale_strings(built: Built, wheel_venv: Path,
                                                                     tmp_path: Path) -> None:
    """Run outside any checkout: `h3bridge.comfy` is the installed one, and what ComfyUI would
    load from it as a custom node is inside it."""
    python, venv = wheel_venv, wheel_venv.parent.parent
    script = (
        "import json, pathlib, h3bridge.comfy as comfy, h3bridge.comfy.locales as locales\n"
        "folder = pathlib.Path(comfy.__file__).parent\n"
        "web = (folder / comfy.WEB_DIRECTORY).resolve()\n"
        "pages = {f'{p.parent.name}/{p.name}': json.loads(p.read_text(encoding='utf-8'))\n"
        "         for p in sorted((folder / 'locales').glob('*/*.json'))}\n"
        "print(json.dumps({'package': str(folder.resolve()), 'web': sorted(p.name for p in web.glob('*.js')),\n"
        "                  'zh_strings': json.loads(locales.ZH_STRINGS.read_text(encoding='utf-8')),\n"
        "                  'pages': pages, 'entrypoint': callable(comfy.comfy_entrypoint)}))\n")
    run = subprocess.run([str(python), "-I", "-c", script], cwd=tmp_path, env=outside_any_venv(), capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout)
    assert Path(found["package"]).is_relative_to(venv.resolve()), found["package"]
    assert found["web"] == sorted(p.name for p in (built.sources / "h3bridge/comfy/web").glob("*.js"))
    assert "h3_prompt_labels.js" in found["web"]
    assert found["zh_strings"] == json.loads((built.sources / "h3bridge/comfy/zh_strings.json").read_text("utf-8"))
    assert found["pages"] == {f"{language}/{page}": json.loads((built.sources / "locales" / language / page)
                                                               .read_text(encoding="utf-8"))
                              for language in ("en", "zh") for page in ("main.json", "nodeDefs.json")}
    assert found["entrypoint"] is True


@pytest.mark.slow
def test_the_installed_package_linked_into_custom_nodes_loads_as_comfyui_loads_a_custom_node(
        wheel_venv: Path, tmp_path: Path) -> None:
    """docs/comfyui.md's wheel install: the folder its `python -c` prints, linked into
    custom_nodes, loaded the way ComfyUI loads a custom node folder (nodes.py load_custom_node: its
    __init__.py under a module name made from the path; WEB_DIRECTORY relative to the folder;
    app/custom_node_manager.py: custom_nodes/*/locales/<lang>/*.json). comfy_entrypoint needs
    ComfyUI itself to run (tests/test_comfy_install.py); here it must be there and awaitable."""
    python, env = wheel_venv, outside_any_venv()
    page = (REPO_DOCS / "comfyui.md").read_text(encoding="utf-8")
    command = re.search(r'^ln -s "\$\(python -c \'(.+?)\'\)" ComfyUI/custom_nodes/h3bridge$', page, flags=re.M)
    assert command, "docs/comfyui.md's `ln -s` line for a wheel install"
    where = subprocess.run([str(python), "-c", command[1]], cwd=tmp_path, env=env, capture_output=True, text=True,
                           check=True, timeout=60).stdout.strip()
    custom_nodes = tmp_path / "ComfyUI" / "custom_nodes"
    custom_nodes.mkdir(parents=True)
    (custom_nodes / "h3bridge").symlink_to(where)
    script = (
        "import glob, importlib.util, inspect, json, os, sys\n"
        "module_path = sys.argv[1]\n"
        "name = module_path.replace('.', '_x_')\n"
        "spec = importlib.util.spec_from_file_location(name, os.path.join(module_path, '__init__.py'))\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "sys.modules[name] = module\n"
        "spec.loader.exec_module(module)\n"
        "web = os.path.abspath(os.path.join(module_path, module.WEB_DIRECTORY))\n"
        "locales = sorted(os.path.relpath(p, module_path) for p in glob.glob(os.path.join(os.path.dirname(module_path), '*/', 'locales', '*', '*.json')))\n"
        "print(json.dumps({'web': sorted(os.listdir(web)) if os.path.isdir(web) else None, 'locales': locales,\n"
        "                  'entrypoint': inspect.iscoroutinefunction(module.comfy_entrypoint),\n"
        "                  'comfy_api_imported': 'comfy_api' in sys.modules}))\n")
    run = subprocess.run([str(python), "-I", "-c", script, str(custom_nodes / "h3bridge")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout)
    assert "h3_prompt_labels.js" in (found["web"] or [])
    assert found["locales"] == ["locales/en/main.json", "locales/en/nodeDefs.json", "locales/zh/main.json",
                                "locales/zh/nodeDefs.json"]
    assert found["entrypoint"] is True and found["comfy_api_imported"] is False


@pytest.mark.slow
def test_the_build_warns_of_no_deprecation_and_carries_the_license(built: Built) -> None:
    """The backend is the newest setuptools pyproject.toml allows: its output holds no deprecation
    warning (the TOML-table license form stops building on 2027-02-18), and both packages carry
    the SPDX license expression and the license file (PEP 639)."""
    output = built.output
    assert "DeprecationWarning" not in output, output[output.find("DeprecationWarning") - 500:][:1500]
    with zipfile.ZipFile(built.wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: MIT" in metadata.splitlines()
    assert "License-File: LICENSE" in metadata.splitlines()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    with tarfile.open(built.sdist) as archive:
        top = archive.getnames()[0].split("/")[0]
        pkg_info = archive.extractfile(f"{top}/PKG-INFO").read().decode()
    assert "License-Expression: MIT" in pkg_info.splitlines() and "LICENSE" in built.sdist_names()
