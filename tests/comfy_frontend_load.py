"""Load workflows in ComfyUI's real frontend (headless Chromium, DevTools protocol) and report
what the frontend makes of them. Run with a python that has aiohttp (ComfyUI's own):

    python comfy_frontend_load.py http://127.0.0.1:8188 [--screenshots DIR] workflow.json ...

Prints one JSON object: {workflow file name: {"count": nodes loaded, "missing": node types the
frontend does not know, "output": the API prompt from the frontend's own app.graphToPrompt(),
"boxes": each node's [x, y, width, height] on the canvas, "labels": the labels our frontend
extension drew on each node's text boxes}}.
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
    return JSON.stringify({count: nodes.length, missing, output: prompt.output, boxes, labels});
})()"""


def _free_port() -> int:
    import socket
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def _run(url: str, workflows: list[Path], screenshots: Path | None) -> dict:
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
            if screenshots is not None:   # the minimap would cover part of the graph in the pictures
                await evaluate("(async () => { try { await app.extensionManager.setting.set("
                               "'Comfy.Minimap.Visible', false); } catch (e) {} return true; })()")
            report = {}
            for path in workflows:
                workflow = json.loads(path.read_text())
                report[path.name] = json.loads(await evaluate(LOAD_SCRIPT % json.dumps(workflow)))
                if screenshots is not None:
                    for kind in ("keyDown", "keyUp"):   # close the first-run templates dialog
                        await call("Input.dispatchKeyEvent", type=kind, key="Escape", code="Escape",
                                   windowsVirtualKeyCode=27)
                    await asyncio.sleep(0.3)
                    shot = await call("Page.captureScreenshot", format="png")
                    screenshots.mkdir(parents=True, exist_ok=True)
                    (screenshots / (path.stem + ".png")).write_bytes(base64.b64decode(shot["data"]))
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
    args = parser.parse_args()
    print(json.dumps(asyncio.run(_run(args.url, args.workflows, args.screenshots))))


if __name__ == "__main__":
    main()
