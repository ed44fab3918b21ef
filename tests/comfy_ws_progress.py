"""Queue an API prompt on a ComfyUI server and record the progress messages it broadcasts over
its websocket (what the frontend draws as each node's progress bar). Run with a python that has
aiohttp (ComfyUI's own):

    python comfy_ws_progress.py http://127.0.0.1:8188 prompt.json

Prints one JSON object: {"prompt_id": ..., "progress": [[node, value, max], ...], "texts": [[node,
text], ...] (the text a node shows on itself, ComfyUI's progress text), "previews": [[node, bar
value when it arrived, image bytes], ...] (preview images, as KSampler's reach the frontend), "status":
last status message type}. Only talks to 127.0.0.1.
"""
from __future__ import annotations

import asyncio
import json
import struct
import sys
import uuid

import aiohttp


async def _run(url: str, prompt: dict) -> dict:
    client_id = uuid.uuid4().hex
    progress: list[list] = []
    texts: list[list] = []
    previews: list[list] = []
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(f"{url}/ws?clientId={client_id}", max_msg_size=0) as ws:
            async with session.post(f"{url}/prompt", json={"prompt": prompt, "client_id": client_id}) as answer:
                prompt_id = (await answer.json())["prompt_id"]
            status = None
            async with asyncio.timeout(300):
                async for message in ws:
                    if message.type == aiohttp.WSMsgType.BINARY:
                        # server.py send_sync: a big-endian u32 event type; protocol.py TEXT (3) is
                        # send_progress_text: u32 node id length, node id, the text.
                        kind, = struct.unpack(">I", message.data[:4])
                        if kind == 3:
                            length, = struct.unpack(">I", message.data[4:8])
                            texts.append([message.data[8:8 + length].decode(),
                                          message.data[8 + length:].decode("utf-8", "replace")])
                        elif kind == 1 and progress:
                            # protocol.py PREVIEW_IMAGE: u32 image type, the image; it follows the
                            # "progress" message of the node it belongs to (main.py hook)
                            previews.append([progress[-1][0], progress[-1][1], len(message.data) - 8])
                        elif kind == 4:
                            # PREVIEW_IMAGE_WITH_METADATA: u32 metadata length, metadata JSON, image
                            length, = struct.unpack(">I", message.data[4:8])
                            metadata = json.loads(message.data[8:8 + length])
                            node = metadata.get("node_id")
                            value = next((v for n, v, _ in reversed(progress) if n == node), None)
                            previews.append([node, value, len(message.data) - 8 - length])
                        continue
                    if message.type != aiohttp.WSMsgType.TEXT:
                        continue
                    event = json.loads(message.data)
                    data = event.get("data", {})
                    if data.get("prompt_id") not in (None, prompt_id):
                        continue
                    if event["type"] == "progress":
                        progress.append([data.get("node"), data["value"], data["max"]])
                    elif event["type"] in ("execution_success", "execution_error", "execution_interrupted"):
                        status = event["type"]
                        break
    return {"prompt_id": prompt_id, "progress": progress, "texts": texts, "previews": previews, "status": status}


def main() -> None:
    url, path = sys.argv[1], sys.argv[2]
    with open(path) as handle:
        prompt = json.load(handle)
    print(json.dumps(asyncio.run(_run(url, prompt))))


if __name__ == "__main__":
    main()
