"""Load workflows in ComfyUI's real frontend (headless Chromium, DevTools protocol) and report
what the frontend makes of them. Run with a python that has aiohttp (ComfyUI's own):

    python comfy_frontend_load.py http://127.0.0.1:8188 [--screenshots DIR] [--run N | --refusal] [--locale zh]
        [--after-load JS] workflow.json ...

Prints one JSON object: {workflow file name: {"count": nodes loaded, "missing": node types the
frontend does not know, "output": the API prompt from the frontend's own app.graphToPrompt(),
"boxes": each node's [x, y, width, height] on the canvas, "labels": the labels our frontend
extension drew on each node's text boxes, "sockets": each node's input sockets as the canvas names
them, "widgets": each node's widget names, "shown": each node's title and widget labels as drawn, "runs": with --run N, the frontend's Run button clicked
N times (a real mouse click), each run's history entry once it finished: {"prompt": the API
prompt the frontend sent, "status", "outputs"}, "tooltips": with --hover, the tooltip shown over each widget, "node_errors": with --refusal, the errors of ComfyUI's
input validation as the frontend holds them (app.lastNodeErrors) after one click on Run}}. --edits '[{}, {"2": {"shots": "..."}}]': before
run i, set those widgets (node id -> widget name -> value) as typing into them would.
Only talks to 127.0.0.1.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp

LOAD_SCRIPT = """(async () => {
    await app.loadGraphData(%s);
    await new Promise(resolve => setTimeout(resolve, 300));
    const nodes = app.graph._nodes;
    const missing = nodes.filter(n => !LiteGraph.registered_node_types[n.type]).map(n => n.type);
    const prompt = await app.graphToPrompt();
    // What the user sees: each node's box on the canvas, and the labels drawn on text boxes.
    const boxes = nodes.map(n => ({id: n.id, type: n.type, box: Array.from(n.getBounding())}));
    const labels = nodes.map(n => ({id: n.id, type: n.type, labels: (n.widgets || [])
        .map(w => w.element || w.inputEl).filter(e => e && e.dataset && e.dataset.h3Label)
        .map(e => e.dataset.h3Label)}));
    // The input sockets as the canvas names them (label, else localized name, else name).
    const sockets = nodes.map(n => ({id: n.id, type: n.type, inputs: (n.inputs || [])
        .map(i => i.label || i.localized_name || i.name)}));
    // The widgets each node shows (a dynamic combo's: its chosen option's).
    const widgets = nodes.map(n => ({id: n.id, type: n.type, widgets: (n.widgets || []).map(w => w.name)}));
    // What a user reads: each node's title and its widgets' labels (translated with a locale set).
    const shown = nodes.map(n => ({id: n.id, type: n.type, title: n.title,
        widgets: (n.widgets || []).map(w => w.label || w.name)}));
    return JSON.stringify({count: nodes.length, missing, output: prompt.output, boxes, labels, sockets, widgets,
                           shown});
})()"""


def _free_port() -> int:
    import socket
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.load(response)


def _wait_for_new_history(url: str, known: set[str], timeout: float = 300) -> dict:
    """The history entry of the one prompt not in `known`, once it has finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for prompt_id, entry in _get(url + "/history").items():
            if prompt_id not in known and entry.get("status", {}).get("completed") is not None:
                known.add(prompt_id)
                return {"prompt_id": prompt_id, "prompt": entry["prompt"][2], "status": entry["status"],
                        "outputs": entry["outputs"]}
        time.sleep(0.25)
    raise SystemExit(f"no prompt queued by the Run button finished within {timeout} s")


EDIT_SCRIPT = """(() => {
    const edits = %s;
    for (const [id, values] of Object.entries(edits)) {
        const node = app.graph.getNodeById(Number(id));
        for (const [name, value] of Object.entries(values)) {
            const widget = node.widgets.find(w => w.name === name);
            widget.value = value;
            widget.callback?.(value, app.canvas, node);
        }
    }
    app.graph.setDirtyCanvas(true, true);
    return true;
})()"""


REFUSAL_SCRIPT = """(() => JSON.stringify(app.lastNodeErrors ?? null))()"""

# Where a node's widget is on the screen (CSS pixels), for a mouse hover over it.
WIDGET_AT_SCRIPT = """(() => {
    const [type, name] = %s;
    const node = app.graph._nodes.find(n => n.type === type);
    const widget = node?.widgets?.find(w => w.name === name);
    if (!widget || widget.last_y === undefined) return null;
    const rect = app.canvas.canvas.getBoundingClientRect();
    const [x, y] = app.canvas.ds.convertOffsetToCanvas([node.pos[0] + node.size[0] / 3, node.pos[1] + widget.last_y + 10]);
    return [rect.left + x / (window.devicePixelRatio || 1), rect.top + y / (window.devicePixelRatio || 1)];
})()"""


async def _run(url: str, workflows: list[Path], screenshots: Path | None, runs: int = 0,
               edits: list[dict] | None = None, locale: str | None = None, after_load: str | None = None,
               refusal: bool = False, hover: list[str] | None = None) -> dict:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        raise SystemExit("no chromium on PATH")
    port = _free_port()
    profile = tempfile.mkdtemp(prefix="h3bridge-chromium-")
    process = subprocess.Popen(
        [browser, "--headless=new", "--no-sandbox", "--disable-gpu", f"--remote-debugging-port={port}",
         "--remote-debugging-address=127.0.0.1", f"--user-data-dir={profile}", "--window-size=1700,1000",
         "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        pages = None
        for _ in range(150):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=5) as response:
                    pages = json.load(response)
                break
            except OSError:
                time.sleep(0.2)
        if pages is None:
            raise SystemExit("chromium did not start")
        socket_url = next(page["webSocketDebuggerUrl"] for page in pages if page["type"] == "page")
        async with aiohttp.ClientSession() as session, session.ws_connect(socket_url, max_msg_size=0) as ws:
            counter = 0

            async def call(method: str, **params: object) -> dict:
                nonlocal counter
                counter += 1
                ident = counter
                await ws.send_json({"id": ident, "method": method, "params": params})
                while True:
                    message = await ws.receive_json()
                    if message.get("id") == ident:
                        if "error" in message:
                            raise RuntimeError(message["error"])
                        return message["result"]

            async def evaluate(expression: str) -> object:
                result = await call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
                if "exceptionDetails" in result:
                    raise RuntimeError(json.dumps(result["exceptionDetails"])[:3000])
                return result["result"].get("value")

            await call("Page.enable")
            await call("Page.navigate", url=url + "/")
            ready = False
            for _ in range(600):
                ready = bool(await evaluate("!!(window.app && window.app.graph && window.LiteGraph)"))
                if ready:
                    break
                await asyncio.sleep(0.2)
            if not ready:
                raise SystemExit("the ComfyUI frontend did not load")
            await asyncio.sleep(1.0)      # let extensions register their node types
            if locale:      # the frontend's language setting, then a reload so node definitions use it
                await evaluate("(async () => { await app.extensionManager.setting.set('Comfy.Locale', %s);"
                               " return true; })()" % json.dumps(locale))
                await call("Page.reload")
                await asyncio.sleep(1.0)
                for _ in range(600):
                    if await evaluate("!!(window.app && window.app.graph && window.LiteGraph)"):
                        break
                    await asyncio.sleep(0.2)
                await asyncio.sleep(2.0)
            if screenshots is not None:   # the minimap would cover part of the graph in the pictures
                await evaluate("(async () => { try { await app.extensionManager.setting.set("
                               "'Comfy.Minimap.Visible', false); } catch (e) {} return true; })()")
            async def close_dialogs() -> None:
                for kind in ("keyDown", "keyUp"):   # e.g. the first-run templates dialog
                    await call("Input.dispatchKeyEvent", type=kind, key="Escape", code="Escape",
                               windowsVirtualKeyCode=27)
                await asyncio.sleep(0.3)

            async def screenshot(name: str) -> None:
                shot = await call("Page.captureScreenshot", format="png")
                screenshots.mkdir(parents=True, exist_ok=True)
                (screenshots / f"{name}.png").write_bytes(base64.b64decode(shot["data"]))

            async def click_run() -> None:
                """A mouse click on the frontend's own Run button (the queue button of its action bar)."""
                box = None
                for _ in range(100):
                    box = await evaluate("(() => { const b = document.querySelector('[data-testid=\"queue-button\"]');"
                                         " if (!b) return null; const r = b.getBoundingClientRect();"
                                         " return [r.x + r.width / 2, r.y + r.height / 2]; })()")
                    if box:
                        break
                    await asyncio.sleep(0.2)
                if not box:
                    raise SystemExit("the frontend shows no Run button")
                for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
                    await call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left",
                               clickCount=1)

            report = {}
            for path in workflows:
                workflow = json.loads(path.read_text())
                report[path.name] = json.loads(await evaluate(LOAD_SCRIPT % json.dumps(workflow)))
                if after_load:
                    report[path.name]["after_load"] = await evaluate(after_load)
                    await asyncio.sleep(0.5)
                if screenshots is not None or runs or refusal:
                    await close_dialogs()
                if screenshots is not None:
                    await screenshot(path.stem)
                for target in hover or []:     # NODE_TYPE:WIDGET: the tooltip the frontend shows for it
                    spot = await evaluate(WIDGET_AT_SCRIPT % json.dumps(target.split(":", 1)))
                    report[path.name].setdefault("hovered", {})[target] = spot
                    if spot:
                        await call("Input.dispatchMouseEvent", type="mouseMoved", x=spot[0], y=spot[1])
                        await asyncio.sleep(2.0)
                        report[path.name].setdefault("tooltips", {})[target] = await evaluate(
                            "Array.from(document.querySelectorAll('[role=tooltip], .p-tooltip, [class*=tooltip]'))"
                            ".map(e => e.innerText.trim()).filter(Boolean).join('\\n')")
                        if screenshots is not None:
                            await screenshot(f"{path.stem}-hover-{target.replace(':', '-').replace('.', '_')}")
                if refusal:     # Run, refused by ComfyUI's input validation: what the frontend got and shows
                    await click_run()
                    errors = None
                    for _ in range(300):
                        errors = json.loads(await evaluate(REFUSAL_SCRIPT))
                        if errors:
                            break
                        await asyncio.sleep(0.1)
                    report[path.name]["node_errors"] = errors
                    await asyncio.sleep(1.0)       # the toast and the red widgets are drawn
                    if screenshots is not None:
                        await screenshot(f"{path.stem}-refused")
                    continue
                known = set(_get(url + "/history"))
                report[path.name]["runs"] = []
                for number in range(1, runs + 1):
                    if edits and number <= len(edits) and edits[number - 1]:
                        await evaluate(EDIT_SCRIPT % json.dumps(edits[number - 1]))
                    await click_run()
                    report[path.name]["runs"].append(await asyncio.to_thread(_wait_for_new_history, url, known))
                    await asyncio.sleep(0.5)       # the frontend draws the finished run's outputs
                    if screenshots is not None:
                        await screenshot(f"{path.stem}-run{number}")
            return report
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
        shutil.rmtree(profile, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("workflows", nargs="+", type=Path)
    parser.add_argument("--screenshots", type=Path)
    parser.add_argument("--run", type=int, default=0, help="click the frontend's Run button this many times")
    parser.add_argument("--locale", help="the frontend's language (Comfy.Locale), e.g. zh, set before loading")
    parser.add_argument("--after-load", help="JavaScript evaluated in the page after each workflow loads")
    parser.add_argument("--hover", action="append", metavar="NODE_TYPE:WIDGET",
                        help="move the mouse over this widget and screenshot its tooltip (repeatable)")
    parser.add_argument("--refusal", action="store_true",
                        help="click Run once and report app.lastNodeErrors (the graph is refused before it runs)")
    parser.add_argument("--edits", type=json.loads, default=None,
                        help="JSON list, one entry per run: {node id: {widget: value}} set before that run")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(_run(args.url, args.workflows, args.screenshots, args.run, args.edits, args.locale,
                                      args.after_load, args.refusal, args.hover))))


if __name__ == "__main__":
    main()
