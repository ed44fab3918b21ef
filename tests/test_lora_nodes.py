"""The H3 LoRA ComfyUI node, called in-process. Needs ComfyUI importable, so it runs in ComfyUI's
own python with the checkout on sys.path; skipped otherwise (the fold and its cache are tested in
test_lora_fold.py and test_lora_cache.py):

    cd /work/main && COMFYUI_DIR=/tmp/comfy-bed/ComfyUI /tmp/comfy-bed/venv/bin/python -m pytest -q \
        tests/test_lora_nodes.py

(from a checkout whose folder name is a Python identifier: pytest imports the repository root's
__init__.py as a package, which fails for a folder such as wt-13.)
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from comfy_helpers import require_comfyui_in_process  # noqa: E402

torch = require_comfyui_in_process()

import folder_paths  # noqa: E402

from lora_helpers import low_rank, tensor_shapes, write_lora  # noqa: E402
from h3bridge.comfy.lora_nodes import LORA_NODES, H3LoraNode  # noqa: E402
from h3bridge.errors import LoraError  # noqa: E402
from h3bridge.lora import read_provenance  # noqa: E402
from h3bridge.sim.fixture import write_fixture_model  # noqa: E402


@pytest.fixture
def loras(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "loras"
    folder.mkdir()
    monkeypatch.setitem(folder_paths.folder_names_and_paths, "loras", ([str(folder)], {".safetensors"}))
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(tmp_path / "cache"))
    return folder


def test_the_node_is_registered_with_a_tooltip_on_every_input() -> None:
    import asyncio

    from h3bridge.comfy.nodes import comfy_entrypoint
    listed = asyncio.run(asyncio.run(comfy_entrypoint()).get_node_list())
    assert all(node in listed for node in LORA_NODES)
    schema = H3LoraNode.define_schema()
    assert schema.display_name == "H3 LoRA" and all(item.tooltip for item in schema.inputs)


def test_chained_nodes_fold_once_and_feed_the_engine_a_model_dir(tmp_path: Path, loras: Path) -> None:
    model = write_fixture_model(tmp_path / "models" / "MiniMax-H3", ref2va=False)
    _two_loras(model, loras)
    first = H3LoraNode.execute(model_dir=str(model), lora="turbo.safetensors", strength=1.0).result[0]
    done = H3LoraNode.execute(model_dir=first, lora="style.safetensors", strength=0.5)
    second, report = done.result
    record = read_provenance(Path(second))
    # what survived, and where the folds live and what they take (issue 21 items 3, 5)
    assert "what survived the fold" in report and ".h3bridge-lora" in report and "on disk" in report
    assert "H3BRIDGE_LORA_CACHE_LIMIT" in report and done.ui is not None
    assert [(r.name, r.strength) for r in record.loras] == [("turbo.safetensors", 1.0), ("style.safetensors", 0.5)]
    assert H3LoraNode.execute(model_dir=first, lora="style.safetensors", strength=0.5).result[0] == second
    from h3bridge.comfy import adapter
    assert adapter.check_model_setting(second, []) == Path(second)        # what H3 Engine accepts
    (loras / "bad.safetensors").write_bytes((loras / "turbo.safetensors").read_bytes().replace(b"blocks.0", b"blocks.X"))
    with pytest.raises(LoraError, match="match no tensor"):
        H3LoraNode.execute(model_dir=str(model), lora="bad.safetensors", strength=1.0)


def _two_loras(model: Path, loras: Path) -> None:
    shapes, rng = tensor_shapes(model), np.random.default_rng(0)
    for name in ("turbo.safetensors", "style.safetensors"):
        out, inner = shapes["blocks.0.attn.qkv_proj.weight"][2]
        up, down = low_rank(rng, out, inner, 2)
        write_lora(loras / name, {"diffusion_model.blocks.0.attn.qkv_proj.lora_A.weight": down,
                                  "diffusion_model.blocks.0.attn.qkv_proj.lora_B.weight": up})


def test_a_chain_of_two_folds_once_and_equals_folding_both_directly(tmp_path: Path, loras: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 30: A -> B -> H3 Engine writes the A+B fold only (no A-only fold nobody uses)."""
    from comfy_api.latest import io

    from h3bridge.comfy import lora_nodes
    from h3bridge.lora import cache as lora_cache
    from h3bridge.lora.fold import LoraSpec, fold_model
    from h3bridge.model.fold_record import PROVENANCE_FILE

    model = write_fixture_model(tmp_path / "models" / "MiniMax-H3", ref2va=False)
    _two_loras(model, loras)
    prompt = {"1": {"class_type": "H3Lora", "inputs": {"model_dir": str(model), "lora": "turbo.safetensors",
                                                       "strength": 1.0}},
              "2": {"class_type": "H3Lora", "inputs": {"model_dir": ["1", 0], "lora": "style.safetensors",
                                                       "strength": 0.5}},
              "3": {"class_type": "H3Engine", "inputs": {"model_dir": ["2", 0]}}}
    monkeypatch.setattr(lora_nodes, "running_prompt", lambda: prompt)      # ComfyUI's queue, running this graph
    folds: list[object] = []
    real_fold = lora_cache.fold_model
    monkeypatch.setattr(lora_cache, "fold_model", lambda *args, **kwargs: folds.append(args) or real_fold(*args, **kwargs))

    def run(node_id: str, **inputs: object) -> io.NodeOutput:
        monkeypatch.setattr(H3LoraNode, "hidden", io.HiddenHolder.from_dict({io.Hidden.unique_id: node_id}))
        return H3LoraNode.execute(**inputs)

    first = run("1", model_dir=str(model), lora="turbo.safetensors", strength=1.0)
    assert folds == [] and "not folded here" in first.result[1]
    assert not (model.parent / ".h3bridge-lora").exists()
    second = run("2", model_dir=first.result[0], lora="style.safetensors", strength=0.5)
    folded = Path(second.result[0])
    assert len(folds) == 1
    assert [fold.path for fold in lora_cache.list_folds(model.parent / ".h3bridge-lora")] == [folded]
    record = read_provenance(folded)
    assert [(r.name, r.strength) for r in record.loras] == [("turbo.safetensors", 1.0), ("style.safetensors", 0.5)]

    direct = tmp_path / "direct"
    fold_model(model, [LoraSpec(loras / "turbo.safetensors", 1.0), LoraSpec(loras / "style.safetensors", 0.5)],
               direct, progress=False)
    files = sorted(p.relative_to(direct) for p in direct.rglob("*") if p.is_file() and p.name != PROVENANCE_FILE)
    assert files == sorted(p.relative_to(folded) for p in folded.rglob("*")
                           if p.is_file() and p.name != PROVENANCE_FILE)
    assert all((direct / name).read_bytes() == (folded / name).read_bytes() for name in files)

    # The fingerprint carries the decision: connect A to an engine too and A runs again, folding A.
    monkeypatch.setattr(H3LoraNode, "hidden", io.HiddenHolder.from_dict({io.Hidden.unique_id: "1"}))
    assert H3LoraNode.fingerprint_inputs(model_dir=str(model), lora="turbo.safetensors", strength=1.0)[-1] is True
    prompt["4"] = {"class_type": "H3Engine", "inputs": {"model_dir": ["1", 0]}}
    assert H3LoraNode.fingerprint_inputs(model_dir=str(model), lora="turbo.safetensors", strength=1.0)[-1] is False
    alone = run("1", model_dir=str(model), lora="turbo.safetensors", strength=1.0)
    assert len(folds) == 2 and read_provenance(Path(alone.result[0])).loras[0].name == "turbo.safetensors"


def test_the_survival_report_is_on_the_node_with_a_legend(tmp_path: Path, loras: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from h3bridge.comfy import lora_nodes

    model = write_fixture_model(tmp_path / "models" / "MiniMax-H3", ref2va=False)
    _two_loras(model, loras)
    shown: list[tuple[str | None, str]] = []
    monkeypatch.setattr(lora_nodes, "notice_on_node", lambda node_id: lambda text: shown.append((node_id, text)))
    done = H3LoraNode.execute(model_dir=str(model), lora="turbo.safetensors", strength=1.0)
    report = done.result[1]
    assert shown == [(None, report)]                            # on the node, not only on the output
    assert done.ui is not None and done.ui.as_dict() == {"text": (report,)}
    assert lora_nodes.SURVIVAL_LEGEND in report
    # the box on the node shows its first lines: what survived comes first, and once
    first, second = report.splitlines()[:2]
    assert first.startswith("the folded weights hold ") and "of the LoRA's update" in first
    assert second.startswith("what survived the fold") and report.count("what survived") == 1
    assert "LoRA 1: turbo.safetensors x1" in report and ".h3bridge-lora" in report
    for figure in ("rho", "kept", "noise", "unchanged"):
        assert f"\n  {figure} " in lora_nodes.SURVIVAL_LEGEND


def test_with_no_lora_installed_the_list_says_so_and_running_it_says_where_to_put_one(tmp_path: Path,
                                                                                     loras: Path) -> None:
    """An empty list showed as "undefined" in the frontend (issue 30)."""
    from h3bridge.comfy.lora_nodes import NO_LORA_INSTALLED
    lora_input = next(item for item in H3LoraNode.define_schema().inputs if item.id == "lora")
    assert lora_input.options == [NO_LORA_INSTALLED]
    model = write_fixture_model(tmp_path / "models" / "MiniMax-H3", ref2va=False)
    with pytest.raises(LoraError) as caught:
        H3LoraNode.execute(model_dir=str(model), lora=NO_LORA_INSTALLED, strength=1.0)
    assert str(loras) in caught.value.message and str(loras) in (caught.value.hint or "")
