"""The documentation runs as written (issue 24 item 6): README.md, README.zh-CN.md and docs/*.md.

The convention (BRIEF "Documentation", docs/sim-and-testing.md):
- a ```sh block is a script: the suite runs it with `bash -euo pipefail` in a fresh temporary working
  folder, HOME a fresh temporary folder too, `h3bridge`, `h3-sim-model` and h3-sim as `h3` on PATH,
  `H3_DOCS_MODEL` naming a fixture model made once with `h3-sim-model`; what it starts in the
  background is stopped with the block's process group;
- a ```python block runs with this Python, in the same environment, twice in the same folder (a
  reader runs an example again: it must not fail on what its first run left);
- a block passes when it exits 0 and prints nothing unexpected on stderr: no Python warning or
  traceback, no "No such file or directory", no complaint of bash or of a tool it runs
  (UNEXPECTED_STDERR); the programs' own progress and messages are expected;
- a block preceded by `<!-- tested-by: tests/test_x.py::test_name -->` is not run here; that test
  must exist and contain each of the block's lines, so the block cannot drift from what it runs;
- every other fenced block carries a language tag (```text for output, or for commands that need a
  Mac, the real model or the network); an untagged one fails, and so does `bash`/`shell`/`console`
  (say `sh` to have it run, `text` to only show it);
- every relative link names a file of the repository (and a heading in it for `#anchor` links);
- the README fits on a screen (at most 150 lines) with a table of contents into every docs page,
  and its Chinese front page shows the same commands.
"""
from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
README_ZH = REPO / "README.zh-CN.md"
DOCS = REPO / "docs"
BLOCK_TIMEOUT = 300.0          # a safety net for one block on a loaded machine, not an expected time
STOP_GRACE = 15.0              # after a block: SIGTERM to its process group, then SIGKILL after this long
TESTED_BY = re.compile(r"<!--\s*tested-by:\s*(\S+?)::(\S+?)\s*-->")
SHELL_TAGS = {"bash", "shell", "console", "zsh", "shell-session", "sh-session"}
README_MAX_LINES = 150


def doc_files() -> list[Path]:
    return [p for p in (README, README_ZH) if p.exists()] + sorted(DOCS.glob("*.md"))


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


# ----------------------------------------------------------------------------- reading fenced blocks

@dataclass(frozen=True)
class Block:
    path: Path
    line: int                  # 1-based line of the opening fence
    lang: str                  # the info string's first word ("" when untagged)
    text: str
    tested_by: tuple[str, str] | None      # (test file, test name) from the comment just above

    @property
    def where(self) -> str:
        return f"{rel(self.path)}:{self.line}"


_FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})(.*)$")


def read_blocks(path: Path) -> list[Block]:
    """CommonMark's fenced code blocks: a fence of 3+ backticks or tildes opens, the same character
    at least as many times (and nothing else) closes; the comment on the last non-blank line
    before the opening fence may name the test that runs the block."""
    blocks: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, info = opening.group(2), opening.group(3).strip()
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = _FENCE.match(lines[j])
            if closing and closing.group(2)[0] == fence[0] and len(closing.group(2)) >= len(fence) \
                    and not closing.group(3).strip():
                break
            body.append(lines[j])
            j += 1
        before = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        marker = TESTED_BY.search(before)
        blocks.append(Block(path, i + 1, info.split()[0] if info else "", "\n".join(body) + "\n",
                            (marker.group(1), marker.group(2)) if marker else None))
        i = j + 1
    return blocks


def all_blocks() -> list[Block]:
    return [block for path in doc_files() for block in read_blocks(path)]


def runnable(lang: str) -> list[Block]:
    """The blocks of `lang` this file runs. The Chinese README's commands are the English ones
    (test_the_chinese_readme_shows_the_same_commands), so they run once, from README.md."""
    return [b for b in all_blocks() if b.lang == lang and b.tested_by is None and b.path != README_ZH]


# ----------------------------------------------------------------------------- the environment blocks run in

@pytest.fixture(scope="session")
def docs_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder for the front of PATH: h3-sim as `h3` (what a Mac has after building h3.c)."""
    scripts = Path(sys.executable).parent
    folder = tmp_path_factory.mktemp("docs-bin")
    (folder / "h3").symlink_to(scripts / "h3-sim")
    return folder


@pytest.fixture(scope="session")
def docs_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One fixture model for every block (made as a reader would make one: `h3-sim-model DIR`)."""
    model = tmp_path_factory.mktemp("docs-model") / "MiniMax-H3"
    made = subprocess.run([str(Path(sys.executable).parent / "h3-sim-model"), str(model)],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    return model


def block_environment(home: Path, docs_bin: Path, docs_model: Path) -> dict[str, str]:
    """This machine as a reader's shell sees it: HOME fresh, the project's commands on PATH, none of
    h3bridge's or h3's settings (the suite's own lock, machine folder and history files stay, so a
    block never queues behind, or records into, anything outside this test)."""
    keep = {"H3BRIDGE_LOCK_PATH", "H3BRIDGE_MACHINE_DIR", "H3BRIDGE_HISTORY_PATH"}
    env = {k: v for k, v in os.environ.items()
           if (k in keep or not k.startswith(("H3", "XDG_", "VIRTUAL_ENV", "PYTEST_"))) and k != "PATH"}
    path = [str(docs_bin), str(Path(sys.executable).parent), *os.environ.get("PATH", "").split(os.pathsep)]
    env.update(HOME=str(home), PATH=os.pathsep.join(p for p in path if p),
               H3_DOCS_MODEL=str(docs_model),
               H3_SIM_TIME_SCALE="0")           # h3-sim's simulated phase times: no sleeping in the docs' runs
    return env


def _stop_group(pgid: int) -> None:
    """Stop what the block left running (a server started with `&`): SIGTERM to its process group so
    a server stops its engine, SIGKILL for what is still there after STOP_GRACE."""
    for sig, wait in ((signal.SIGTERM, STOP_GRACE), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


# What a block must not print on stderr although it exits 0: a reader would see it and wonder.
# Python's warnings and tracebacks, a file a command looked for too early (a race in the block),
# bash's own errors and a standard tool complaining (`grep: FILE: ...`, `kill: ...`).
UNEXPECTED_STDERR = re.compile(
    r"\b[A-Z][A-Za-z]*Warning\b|^Traceback \(most recent call last\)|No such file or directory"
    r"|command not found|Permission denied|^(?:bash|sh): |^(?:grep|sed|awk|cat|head|tail|cp|mv|rm|ls|kill|"
    r"curl|wait|python3?): ", flags=re.M)


def unexpected_stderr(text: str) -> list[str]:
    """The lines of a block's stderr a reader should not see (UNEXPECTED_STDERR)."""
    return [line for line in text.splitlines() if UNEXPECTED_STDERR.search(line)]


def run_block(argv: list[str], block: Block, tmp_path: Path, env: dict[str, str], *, run: str = "first") -> None:
    """Run the block in tmp_path/work (made by the first run, kept for a run `again`); it must exit
    0 and print nothing unexpected on stderr."""
    work = tmp_path / "work"
    work.mkdir(parents=True, exist_ok=True)
    log, errors = tmp_path / f"output-{run}.txt", tmp_path / f"stderr-{run}.txt"
    # Output goes to files, not pipes: a background server keeps its inherited stdout open long
    # after the block ends, and a pipe would only reach end-of-file when it stops.
    with open(log, "wb") as out, open(errors, "wb") as err:
        process = subprocess.Popen(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=err, start_new_session=True)
        try:
            status = process.wait(timeout=BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired:
            status = None
        finally:
            _stop_group(process.pid)
            process.wait(timeout=10)
    stderr = errors.read_text(errors="replace")
    output = f"{log.read_text(errors='replace')[-3000:]}\n--- stderr ---\n{stderr[-3000:]}"
    where = block.where if run == "first" else f"{block.where} (run {run})"
    assert status is not None, f"{where} did not finish within {BLOCK_TIMEOUT:.0f} s:\n{output}"
    assert status == 0, f"{where} exited {status}:\n{block.text}\n--- output ---\n{output}"
    unexpected = unexpected_stderr(stderr)
    assert not unexpected, f"{where} printed on stderr {unexpected}:\n{block.text}\n--- output ---\n{output}"


# ----------------------------------------------------------------------------- the blocks run as written

@pytest.mark.timeout(BLOCK_TIMEOUT + 60)
@pytest.mark.parametrize("block", runnable("sh"), ids=lambda b: b.where)
def test_sh_block_runs_as_written(block: Block, tmp_path: Path, docs_bin: Path, docs_model: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    run_block(["bash", "-euo", "pipefail", "-c", block.text], block, tmp_path,
              block_environment(home, docs_bin, docs_model))


@pytest.mark.timeout(BLOCK_TIMEOUT + 60)
@pytest.mark.parametrize("block", runnable("python"), ids=lambda b: b.where)
def test_python_block_runs_as_written(block: Block, tmp_path: Path, docs_bin: Path, docs_model: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    script = tmp_path / "example.py"
    script.write_text(block.text, encoding="utf-8")
    environment = block_environment(home, docs_bin, docs_model)
    run_block([sys.executable, str(script)], block, tmp_path, environment)
    run_block([sys.executable, str(script)], block, tmp_path, environment, run="again")


def test_a_block_that_exits_0_fails_on_what_it_should_not_print(tmp_path: Path) -> None:
    """The harness itself: a race's `grep: FILE: No such file or directory` and a Python warning
    fail a block that exits 0; the programs' own progress and refusals on stderr do not."""
    page = README                # only named in the messages
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}
    quiet = Block(page, 1, "sh", "echo 'h3bridge: tokenizer (overall 0%, 0.2 s)' >&2\n"
                                 "echo 'h3bridge: the output fox.mp4 already exists' >&2\n", None)
    run_block(["bash", "-euo", "pipefail", "-c", quiet.text], quiet, tmp_path / "quiet", env)
    for name, text in (("race", "grep -q listening serve.log || true\n"),
                       ("warning", f"{sys.executable} -c 'import warnings; warnings.warn(\"old\", DeprecationWarning)'\n"),
                       ("missing", "no-such-command-here || true\n")):
        block = Block(page, 1, "sh", text, None)
        with pytest.raises(AssertionError, match="printed on stderr"):
            run_block(["bash", "-euo", "pipefail", "-c", block.text], block, tmp_path / name, env)


# ----------------------------------------------------------------------------- blocks other tests run

def test_function_source(test_file: Path, name: str) -> str | None:
    """The source of test `name` in `test_file` (`Class::test` for a method), found by parsing."""
    tree = ast.parse(test_file.read_text(encoding="utf-8"))
    source = test_file.read_text(encoding="utf-8")
    scope: list[ast.stmt] = tree.body
    *classes, function = name.split("::")
    for class_name in classes:
        found = [n for n in scope if isinstance(n, ast.ClassDef) and n.name == class_name]
        if not found:
            return None
        scope = found[0].body
    for node in scope:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
            return ast.get_source_segment(source, node)
    return None


test_function_source.__test__ = False      # a helper, not a test (its name starts with test_)


def command_lines(block: Block) -> list[str]:
    """The lines a tested-by test must contain: every non-blank line but comments, without a
    trailing comment set off by two spaces (the docs' style for explanations)."""
    lines = []
    for line in block.text.splitlines():
        line = re.split(r"\s{2,}#", line, maxsplit=1)[0].strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def reads_its_block(test_file: Path, block: "Block", file_name: str, test_name: str) -> bool:
    """Whether the test's module reads the block from its page by the block's own marker (the
    test then runs the page's text itself, which cannot drift either): the module names the page
    and the marker's `file::test` id."""
    module = test_file.read_text(encoding="utf-8")
    page = block.path.name
    return page in module and f"{file_name}::{test_name}" in module and "tested-by" in module


def test_every_tested_by_block_names_a_test_that_holds_its_lines() -> None:
    """A block not run here is run by a named test: the test must exist (found by parsing its file,
    not by importing it) and contain each of the block's command lines, or read the block from its
    page by its marker and run that."""
    problems = []
    for block in all_blocks():
        if block.tested_by is None:
            continue
        file_name, test_name = block.tested_by
        test_file = REPO / file_name
        if not test_file.is_file():
            problems.append(f"{block.where}: tested-by names {file_name}, which does not exist")
            continue
        source = test_function_source(test_file, test_name)
        if source is None:
            problems.append(f"{block.where}: tested-by names {file_name}::{test_name}, which is not "
                            f"defined there")
            continue
        if reads_its_block(test_file, block, file_name, test_name):
            continue
        normalized = re.sub(r"\s+", " ", source)
        missing = [line for line in command_lines(block) if re.sub(r"\s+", " ", line) not in normalized]
        if missing:
            problems.append(f"{block.where}: {file_name}::{test_name} does not contain {missing}")
    assert not problems, "\n".join(problems)


def test_the_readme_test_command_is_what_ci_runs() -> None:
    """README "Run the tests" is the command .ci/run runs (after its own virtual environment)."""
    line = "python3 -m venv ~/.venvs/h3bridge && . ~/.venvs/h3bridge/bin/activate && pip install -e '.[test]' && python -m pytest -q"
    assert [line] == [b.text.strip() for b in read_blocks(README) if b.lang == "sh" and "pytest" in b.text]
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    venv, activate, command = line.split(" && ", 2)
    assert venv.startswith("python3 -m venv ") and activate.startswith(". ")
    assert re.search(rf"^{re.escape(command)}$", ci, flags=re.M), f".ci/run does not run `{command}`"


# ----------------------------------------------------------------------------- tags

def test_every_fenced_block_has_a_language_tag() -> None:
    problems = []
    for block in all_blocks():
        if not block.lang:
            problems.append(f"{block.where}: untagged block: tag it sh (the suite runs it), python, "
                            f"toml, json, ... or text (shown, not run)")
        elif block.lang in SHELL_TAGS:
            problems.append(f"{block.where}: ```{block.lang}: say ```sh to have the suite run it, or "
                            f"```text to only show it")
    assert not problems, "\n".join(problems)


def test_the_harness_finds_blocks_tags_and_tested_by(tmp_path: Path) -> None:
    """The reader itself: fences of tildes and longer backtick fences, the comment only when it is
    the last non-blank line before the fence, untagged blocks."""
    page = tmp_path / "page.md"
    page.write_text("<!-- tested-by: tests/test_a.py::test_b -->\n\n```sh\necho 1\n```\n"
                    "<!-- tested-by: tests/test_a.py::test_c -->\ntext between\n~~~~python\nx = 1\n```\n~~~~\n"
                    "````\n```sh\n````\n", encoding="utf-8")
    blocks = read_blocks(page)
    assert [(b.lang, b.text, b.tested_by) for b in blocks] == [
        ("sh", "echo 1\n", ("tests/test_a.py", "test_b")),
        ("python", "x = 1\n```\n", None),
        ("", "```sh\n", None)]
    assert command_lines(Block(page, 1, "sh", "# a comment\nh3bridge x  # why\n\n  y\n", None)) == ["h3bridge x", "y"]


# ----------------------------------------------------------------------------- links

_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", flags=re.M)


def prose(text: str, *, inline_code: bool = False) -> str:
    """The text without fenced blocks (and without inline code unless asked: a bracket there is no
    link, but a heading's code is part of its anchor)."""
    out, in_fence = [], None
    for line in text.splitlines():
        fence = _FENCE.match(line)
        if fence and (in_fence is None or (fence.group(2)[0] == in_fence[0] and len(fence.group(2)) >= len(in_fence)
                                           and not fence.group(3).strip())):
            in_fence = fence.group(2) if in_fence is None else None
            continue
        if in_fence is None:
            out.append(line if inline_code else re.sub(r"(`+)(?:(?!\1).)+?\1", "", line))
    return "\n".join(out)


def github_anchor(heading: str) -> str:
    """GitHub's id for a heading: lower case, markup and punctuation dropped (hyphens and
    underscores kept), spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = text.replace("`", "").replace("*", "").lower()
    text = re.sub(r"[^\w\- ]", "", text, flags=re.UNICODE)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for line in prose(path.read_text(encoding="utf-8"), inline_code=True).splitlines():
        heading = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = github_anchor(heading.group(1))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def relative_links(path: Path) -> list[str]:
    text = prose(path.read_text(encoding="utf-8"))
    targets = _LINK.findall(text) + _REFERENCE.findall(text)
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t, flags=re.I)]


def broken_links(path: Path) -> list[str]:
    problems = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            problems.append(f"{rel(path)}: link {target!r}: {file_part} does not exist")
        elif REPO not in resolved.parents and resolved != REPO:
            problems.append(f"{rel(path)}: link {target!r} leaves the repository")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{rel(path)}: link {target!r}: no heading with the anchor #{anchor} in "
                            f"{rel(resolved)}")
    return problems


def test_every_relative_link_resolves() -> None:
    """GitHub-style relative links (to a file, a folder, or a heading: `page.md#anchor`) name what
    exists in the repository."""
    problems = [problem for path in doc_files() for problem in broken_links(path)]
    assert not problems, "\n".join(problems)


def test_the_link_checker_sees_broken_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    monkeypatch.setattr(sys.modules[__name__], "REPO", repo)
    (repo / "docs").mkdir(parents=True)
    (tmp_path / "elsewhere.md").touch()           # exists, but outside the repository
    (repo / "docs" / "b.md").write_text("# The `b` page: parts & pieces\n\n## Again\n## Again\n")
    page = repo / "a.md"
    page.write_text("[ok](docs/b.md) [ok](docs/b.md#the-b-page-parts--pieces) [ok](docs/b.md#again-1) "
                    "[web](https://example.com/x.md) [self](#top)\n# Top\n`[code](nothere.md)`\n"
                    "```text\n[fenced](nothere.md)\n```\n"
                    "[gone](docs/c.md) [anchor](docs/b.md#nope) [out](../elsewhere.md)\n[ref]: docs/d.md\n",
                    encoding="utf-8")
    problems = broken_links(page)
    assert len(problems) == 4, problems
    assert "docs/c.md does not exist" in problems[0] and "#nope" in problems[1]
    assert "leaves the repository" in problems[2] and "docs/d.md does not exist" in problems[3]


# ----------------------------------------------------------------------------- the front pages

def test_the_readme_is_a_front_page_with_a_table_of_contents() -> None:
    """At most 150 lines, in sections, and every page of docs/ reachable from it."""
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"
    assert lines[0].startswith("# ") and sum(1 for line in lines if line.startswith("## ")) >= 4
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in relative_links(README)}
    unlisted = [rel(p) for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not unlisted, f"docs pages the README's table of contents does not link: {unlisted}"
    assert "README.zh-CN.md" in "\n".join(lines[:5]), "the Chinese front page is linked at the top"


def test_the_chinese_readme_shows_the_same_commands() -> None:
    """README.zh-CN.md is the same front page in Chinese: the same sh blocks in the same order (and
    the same tested-by tests), the same number of sections, the same pages linked."""
    english, chinese = read_blocks(README), read_blocks(README_ZH)
    assert [(b.text, b.tested_by) for b in chinese if b.lang == "sh"] == \
           [(b.text, b.tested_by) for b in english if b.lang == "sh"]
    assert [b.text for b in chinese if b.lang != "sh"] == [b.text for b in english if b.lang != "sh"]
    sections = [len(re.findall(r"^## ", p.read_text(encoding="utf-8"), flags=re.M)) for p in (README, README_ZH)]
    assert sections[0] == sections[1]
    assert sorted(t.partition("#")[0] for t in relative_links(README) if t != "README.zh-CN.md") == \
           sorted(t.partition("#")[0] for t in relative_links(README_ZH) if t != "README.md")
    assert len(README_ZH.read_text(encoding="utf-8").splitlines()) <= README_MAX_LINES
    assert re.search(r"[\u4e00-\u9fff]", README_ZH.read_text(encoding="utf-8"))
