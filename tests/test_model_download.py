"""`h3bridge model download` against a local hub (tests/hub_helpers.py) serving the fixture model."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from h3bridge.errors import DiskError, IntegrityError, ModelError
from h3bridge.model.download import PARTS, check_space, download_model, plan_download
from hub_helpers import COMMIT, TestHub, fixture_files, hub, hub_env  # noqa: F401 (fixtures)

BOUND = 60.0      # every wait is bounded; a safety net on a loaded machine


def _quiet_download(directory: Path, **options: object):
    return download_model(directory, progress=False, say=lambda text: None, **options)


def test_download_all_places_both_partitions_shares_identical_files_and_verifies(hub: TestHub, tmp_path: Path) -> None:
    result = _quiet_download(tmp_path / "MiniMax-H3")
    root = tmp_path / "MiniMax-H3"
    assert result.report.ok and result.plan.commit == COMMIT
    for path, item in hub.files.items():
        assert (root / path).read_bytes() == item.data, path
    # identical by the hub's sha256: one inode; the Ref2VA transformer (different bytes): its own
    shared = root / "FL2VA/text_encoder/model-00001-of-00014.safetensors"
    assert os.path.samefile(shared, root / "Ref2VA/text_encoder/model-00001-of-00014.safetensors")
    assert shared.stat().st_nlink == 2
    assert not os.path.samefile(root / "FL2VA/transformer/model-00001-of-00007.safetensors",
                                root / "Ref2VA/transformer/model-00001-of-00007.safetensors")
    # each shared content was fetched once
    assert len(hub.gets("Ref2VA/text_encoder/model-00001-of-00014.safetensors")) + \
        len(hub.gets("FL2VA/text_encoder/model-00001-of-00014.safetensors")) == 1
    assert {r.expected_source for r in result.report.results} == {"huggingface-download"}
    assert not (root / PARTS).exists()
