"""`h3bridge fleet`: the LiteLLM proxy configuration it writes (keys as os.environ references only,
retries, cooldown, routing), its refusals naming the flag, and its file handling (atomic, never
over the user's file without --overwrite). The proxy itself runs in tests/test_fleet_litellm.py."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from h3bridge.errors import OutputExistsError, RequestError
from h3bridge.fleet import FleetServer, FleetSettings, ServerKind, fleet_config, write_fleet_config

from core_helpers import not_regular_outputs

SECRET = "sk-do-not-write-me-0123456789"


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """`h3bridge fleet ARGS` (in this process: the CLI's own main) in tmp_path, with keys in the environment."""
    from h3bridge.cli.main import main
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("H3BRIDGE_API_KEY", SECRET)
    monkeypatch.setenv("LITELLM_MASTER_KEY", SECRET)

    def run_fleet(*args: str) -> Ran:
        capsys.readouterr()
        try:
            status = main(["fleet", *args])
        except SystemExit as exit_:     # argparse's own refusals
            status = int(exit_.code or 0)
        out, err = capsys.readouterr()
        return Ran(status, out, err)
    return run_fleet


def test_the_config_has_one_deployment_per_server_keys_from_the_environment_and_retries(tmp_path: Path, run) -> None:
    done = run("--server", "http://mac1.local:8765", "--server", "http://10.0.0.2:8765/",
                "--vllm-omni", "http://gpu.lan:8091/v1", "--sglang", "http://gpu.lan:30000",
                "--peer-key-env", "GPU_KEY", "-o", "litellm.yaml")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "litellm.yaml").read_text()
    assert SECRET not in text
    config = yaml.safe_load(text)
    deployments = config["model_list"]
    assert [d["model_name"] for d in deployments] == ["MiniMax-H3"] * 4
    assert [d["litellm_params"]["model"] for d in deployments] == [
        "hosted_vllm/MiniMax-H3", "hosted_vllm/MiniMax-H3", "hosted_vllm/MiniMax-H3", "openai/MiniMax-H3"]
    assert [d["litellm_params"]["api_base"] for d in deployments] == [
        "http://mac1.local:8765/v1", "http://10.0.0.2:8765/v1", "http://gpu.lan:8091/v1", "http://gpu.lan:30000/v1"]
    assert [d["litellm_params"]["api_key"] for d in deployments] == [
        "os.environ/H3BRIDGE_API_KEY", "os.environ/H3BRIDGE_API_KEY", "os.environ/GPU_KEY", "os.environ/GPU_KEY"]
    ids = [d["model_info"]["id"] for d in deployments]
    assert ids == ["h3bridge-mac1.local-8765", "h3bridge-10.0.0.2-8765", "vllm-omni-gpu.lan-8091", "sglang-gpu.lan-30000"]
    router = config["router_settings"]
    assert router["routing_strategy"] == "simple-shuffle"
    # four servers: 20 picks (the pick is random, without cooldowns a dead server may come up again)
    assert router["num_retries"] == 20 and router["disable_cooldowns"] is True and "cooldown_time" not in router
    assert config["general_settings"] == {"master_key": "os.environ/LITELLM_MASTER_KEY"}


def test_printed_without_a_file(tmp_path: Path, run) -> None:
    done = run("--server", "http://127.0.0.1:8765", "--routing", "least-busy", "--retries", "5",
                "--cooldown", "12")
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    assert config["router_settings"]["routing_strategy"] == "least-busy"
    router = config["router_settings"]
    assert router["num_retries"] == 5 and router["cooldown_time"] == 12.0 and "disable_cooldowns" not in router
    assert router["allowed_fails_policy"] == {"RateLimitErrorAllowedFails": 1_000_000}     # a full server never cools
    assert list(tmp_path.iterdir()) == []


def test_the_users_file_is_never_overwritten_without_overwrite(tmp_path: Path, run) -> None:
    mine = tmp_path / "litellm.yaml"
    mine.write_text("# my own config\n")
    done = run("--server", "http://127.0.0.1:8765", "-o", "litellm.yaml")
    assert done.returncode == 2
    assert "-o litellm.yaml already exists" in done.stderr
    assert done.stderr.rstrip().endswith("fix: choose another name, or allow overwriting (--overwrite)"), done.stderr
    assert mine.read_text() == "# my own config\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["litellm.yaml"]      # no temporary left
    done = run("--server", "http://127.0.0.1:8765", "-o", "litellm.yaml", "--overwrite")
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(mine.read_text())["model_list"][0]["litellm_params"]["api_base"] == "http://127.0.0.1:8765/v1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["litellm.yaml"]


@pytest.mark.parametrize(("args", "words"), [
    ((), ["--server", "at least one server"]),
    (("--server", "mac1.local:8765"), ["--server 'mac1.local:8765' is not a server's base URL",
                                       "--server http://mac1.local:8765"]),
    (("--server", "http://mac1.local:8765/v1/videos"), ["is not a server's base URL"]),
    (("--server", "http://a:1", "--server", "http://a:1/v1"), ["names the same server", "give each server once"]),
    (("--server", "http://a:1", "--key-env", SECRET), ["--key-env takes the name of an environment variable"]),
    (("--server", "http://a:1", "--master-key-env", "my key"), ["--master-key-env"]),
    (("--server", "http://a:1", "--cooldown", "-1"), ["--cooldown -1 must be 0 (no cooldown) or more"]),
    (("--server", "http://a:1", "--retries", "-1"), ["--retries -1 must be 0 or more"]),
    (("--server", "http://a:1", "-o", "missing/litellm.yaml"), ["-o missing/litellm.yaml", "mkdir -p missing"]),
])
def test_refusals_name_the_flag_and_write_nothing(tmp_path: Path, run, args: tuple[str, ...],
                                                  words: list[str]) -> None:
    done = run(*args)
    assert done.returncode == 2
    for word in words:
        assert word in done.stderr
    assert SECRET not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_suggested_fix_is_itself_valid() -> None:
    with pytest.raises(RequestError) as refused:
        fleet_config(FleetSettings(servers=(FleetServer("mac1.local:8765"),)))
    suggested = refused.value.hint.split("e.g. ")[1].split()
    assert suggested[0] == "--server"
    fleet_config(FleetSettings(servers=(FleetServer(suggested[1]),)))


def test_write_is_atomic_and_refuses_a_file_that_appears(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    target = tmp_path / "fleet.yaml"
    settings = FleetSettings(servers=(FleetServer("http://127.0.0.1:8765", ServerKind.H3BRIDGE),))
    real_link = os.link

    def someone_else_writes_first(source, destination, *args, **kwargs):
        Path(destination).write_text("theirs\n")
        return real_link(source, destination, *args, **kwargs)

    monkeypatch.setattr(os, "link", someone_else_writes_first)
    with pytest.raises(OutputExistsError):
        write_fleet_config(settings, target)
    assert target.read_text() == "theirs\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.yaml"]


def test_the_default_retries_find_a_live_server_with_one_of_three_down() -> None:
    """With one retry per other server, a create failed when simple-shuffle picked the dead server
    three times (1 in 27; it happened in CI). The default gives every create enough random picks."""
    from h3bridge.fleet.config import default_retries
    assert default_retries(1) == 20 and default_retries(3) == 20 and default_retries(8) == 32
    assert (1 / 3) ** (default_retries(3) + 1) < 1e-6
    assert all((1 / n) ** (default_retries(n) + 1) < 1e-6 for n in range(2, 20))


# ----------------------------------------------------------------------------- hostile flags (issue 29 item 4)

LONG_HOST = "a" * 100_000


@pytest.mark.parametrize(("args", "flag"), [
    (("--server", f"http://user:{SECRET}@mac1.local:8765"), "--server"),
    (("--server", f"http://{SECRET}@mac1.local:8765"), "--server"),
    (("--vllm-omni", f"https://admin:{SECRET}@gpu.example:8000/v1"), "--vllm-omni"),
    (("--server", f"http://{LONG_HOST}:8765"), "--server"),
    (("--server", f"http://{LONG_HOST}.local"), "--server"),
    (("--server", "http://mac\x01one.local:8765"), "--server"),
    (("--server", "http://mac1.lo\x7fcal:8765"), "--server"),
    (("--server", "http://mac1.local\u2028:8765"), "--server"),
    (("--server", "http://mac one.local:8765"), "--server"),
    (("--server", "http://a:1", "--model-name", "MiniMax-H3\nmodel_list: []"), "--model-name"),
    (("--server", "http://a:1", "--model-name", "x" * 100_000), "--model-name"),
    (("--server", "http://a:1", "--retries", str(10**400)), "--retries"),
    (("--server", "http://a:1", "--retries", "9" * 5000), "--retries"),
    (("--server", "http://a:1", "--retries", str(10**30)), "--retries"),
    (("--server", "http://a:1", "--timeout", "inf"), "--timeout"),
    (("--server", "http://a:1", "--timeout", "nan"), "--timeout"),
    (("--server", "http://a:1", "--timeout", "1e999"), "--timeout"),
    (("--server", "http://a:1", "--cooldown", "inf"), "--cooldown"),
    (("--server", "http://a:1", "--cooldown", "nan"), "--cooldown"),
], ids=["key in --server", "user only", "key in --vllm-omni", "100000-char host", "100000-char name",
        "control char", "DEL", "line separator", "space", "newline in model", "100000-char model",
        "400-digit retries", "5000-digit retries", "31-digit retries", "timeout inf", "timeout nan",
        "timeout 1e999", "cooldown inf", "cooldown nan"])
def test_hostile_flags_are_refused_naming_the_flag_without_echoing_secrets_or_floods(
        tmp_path: Path, run, args: tuple[str, ...], flag: str) -> None:
    done = run(*args, "-o", "litellm.yaml")
    assert done.returncode == 2, done
    assert flag in done.stderr and "fix:" in done.stderr, done.stderr
    assert SECRET not in done.stderr and SECRET not in done.stdout
    assert len(done.stderr) < 1500, len(done.stderr)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("settings", [
    FleetSettings(servers=(FleetServer("http://a:1"),), retries=10**400),
    FleetSettings(servers=(FleetServer("http://a:1"),), timeout_seconds=float("inf")),
    FleetSettings(servers=(FleetServer("http://a:1"),), cooldown_seconds=float("nan")),
    FleetSettings(servers=(FleetServer("http://a:1"),), model_name="a\rb"),
    FleetSettings(servers=(FleetServer("http://a\tb:1"),)),
], ids=["retries", "timeout", "cooldown", "model name", "tab in host"])
def test_the_library_refuses_what_the_cli_refuses(settings: FleetSettings) -> None:
    with pytest.raises(RequestError) as refused:
        fleet_config(settings)
    assert refused.value.field and refused.value.field.startswith("--") and refused.value.hint


def test_the_server_urls_and_numbers_people_use_are_still_taken(tmp_path: Path, run) -> None:
    done = run("--server", "http://[::1]:8765", "--server", "http://mac-1.local:8765/", "--sglang",
               "https://gpu_box.example.com/v1", "--vllm-omni", "http://10.0.0.2:8000", "--retries", "0",
               "--timeout", "1.5", "--cooldown", "30", "--model-name", "MiniMax H3")
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    assert config["router_settings"]["num_retries"] == 0 and len(config["model_list"]) == 4


def _hostile_outputs(tmp_path: Path) -> dict[str, Path]:
    """What -o must never write over, --overwrite or not."""
    return not_regular_outputs(tmp_path, ".yaml")


@pytest.mark.parametrize("overwrite", [(), ("--overwrite",)])
def test_o_never_replaces_a_device_fifo_folder_or_link(tmp_path: Path, run, overwrite: tuple[str, ...]) -> None:
    """`fleet -o /dev/full --overwrite` as root replaced the device node with the YAML (issue 29):
    -o is refused (exit 2, naming what it is) and every name is left as it was."""
    import os
    import stat
    names = _hostile_outputs(tmp_path)
    before = {name: (stat.S_IFMT(os.lstat(path).st_mode), os.lstat(path).st_ino) for name, path in names.items()}
    for what, path in names.items():
        done = run("--server", "http://127.0.0.1:8765", "-o", str(path), *overwrite)
        assert done.returncode == 2, (what, done.stderr)
        assert f"-o {path} already exists and is a" in done.stderr and "Traceback" not in done.stderr, what
    after = {name: (stat.S_IFMT(os.lstat(path).st_mode), os.lstat(path).st_ino) for name, path in names.items()}
    assert after == before and list((tmp_path / "folder.yaml").iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in names.values())
