"""H3 Selftest: `h3bridge selftest` from ComfyUI (issue 33), a thin node over h3bridge/selftest.

It checks the engine an H3 Engine node describes (its mode; with quick off every engine this
machine has), in ComfyUI's execution thread, so the page stays usable while it runs; each check
line shows on the node as it finishes, and the report (Markdown) is the node's output and its text
preview. Cancel (ComfyUI's interrupt) stops it and leaves nothing, as Ctrl-C does on the command line.
"""
from __future__ import annotations

from typing import Any

import comfy.model_management
from comfy_api.latest import io, ui

from ..cancel import CancelToken
from ..selftest import SelftestOptions, run_selftest
from ..vocabulary import read_engine_kind
from .shared import CATEGORY, H3Engine, notice_on_node, user_facing_errors


def _node_id(cls: type[io.ComfyNode]) -> str | None:
    return cls.hidden.unique_id if cls.hidden else None


class H3SelftestNode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3Selftest",
            display_name="H3 Selftest",
            category=CATEGORY,
            description="Check the engine on this machine the way `h3bridge selftest` does: renders, cancels, pause, "
                        "memory and time against the plan; store the measured speed for the ETA and the preset "
                        "advice; write report.md and report.json (nothing private in them) into a new folder in "
                        "h3bridge's cache. Attach both to an issue to tell us how h3bridge runs on your Mac.",
            inputs=[
                H3Engine.Input("engine", tooltip="The H3 Engine node whose engine and model are checked."),
                io.Boolean.Input("quick", default=True,
                                 tooltip="On: only the smallest render with this engine (a minute or two). Off: every "
                                         "engine this machine has, renders, cancels and pause (the time it takes "
                                         "is shown on the node before it starts)."),
                io.Boolean.Input("checksums", default=False,
                                 tooltip="Also hash every model shard against the published checksums (slow: "
                                         "the model is 60+ GB)."),
            ],
            outputs=[io.String.Output(display_name="report", tooltip="The report, as Markdown (also shown on the node)."),
                     io.String.Output(display_name="report_folder",
                                      tooltip="The folder holding report.md and report.json.")],
            hidden=[io.Hidden.unique_id],
            not_idempotent=True,       # a selftest measures now: never served from ComfyUI's cache
        )

    @classmethod
    @user_facing_errors
    def execute(cls, engine: Any, quick: bool, checksums: bool) -> io.NodeOutput:
        show = notice_on_node(_node_id(cls))
        lines: list[str] = []

        def say(line: str) -> None:
            lines.append(line)
            show("\n".join(lines[-12:]))

        kind = read_engine_kind(engine.mode)[0]
        options = SelftestOptions(engine_path=engine.engine_path, model_dir=engine.model_dir,
                                  library_path=engine.library_path, remote_url=engine.remote_url, quick=quick,
                                  checksums=checksums, engines=(kind,) if quick else ())
        outcome = run_selftest(options, say=say,
                               cancel=CancelToken(check=comfy.model_management.processing_interrupted))
        report = outcome.markdown_path.read_text(encoding="utf-8")
        show(f"report: {outcome.markdown_path}")
        return io.NodeOutput(report, str(outcome.folder), ui=ui.PreviewText(report))


SELFTEST_NODES: list[type[io.ComfyNode]] = [H3SelftestNode]

__all__ = ["H3SelftestNode", "SELFTEST_NODES"]
