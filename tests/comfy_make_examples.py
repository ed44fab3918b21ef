"""Regenerate example_workflows/*.json (ComfyUI's UI format) from a running ComfyUI's /object_info,
so widget values line up with the current node schemas:

    python tests/comfy_make_examples.py http://127.0.0.1:8188
"""
import json
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from comfy_workflows import build_ui_workflow  # noqa: E402

with urllib.request.urlopen(sys.argv[1] + "/object_info", timeout=60) as response:
    info = json.load(response)
out = str(Path(__file__).resolve().parents[1] / "example_workflows") + "/"

ENGINE = dict(id=1, type="H3Engine", pos=[40, 80], size=[360, 200],
              widgets={"engine_path": "", "model_dir": "MiniMax-H3", "mode": "one-shot"})

def save(name, nodes, links, note):
    wf = build_ui_workflow(nodes, links, info, extra={"h3bridge": note})
    with open(out + name, "w") as handle:
        json.dump(wf, handle, indent=1)
    print("wrote", out + name)

# 1. text to video + audio
save("h3_text_to_video_audio.json", [
    ENGINE,
    dict(id=2, type="H3Prompt", pos=[40, 320], size=[400, 520], widgets={
        "scene": "a single red fox in a snow-covered pine forest at dawn.",
        "action": "the fox walks steadily left to right and looks toward the camera once.",
        "camera": "medium-height lateral tracking shot, 50 mm lens, stable framing.",
        "look": "photorealistic fur, cold blue ambient light, warm sunrise rim light.",
        "audio": "soft footsteps in snow, light wind through pine branches, no music."}),
    dict(id=3, type="H3Generate", pos=[480, 80], size=[400, 640], widgets={
        "prompt": "", "preset": "balanced", "width": 864, "height": 480, "length_unit": "seconds",
        "seconds": 4.0, "seed": 42}),
    dict(id=4, type="SaveVideo", pos=[920, 80], size=[460, 420], widgets={"filename_prefix": "video/h3_fox"}),
    dict(id=5, type="PreviewAny", pos=[920, 540], size=[460, 300]),
], [(1, 0, 3, "engine"), (2, 0, 3, "prompt"), (3, 0, 4, "video"), (3, 3, 5, "source")],
   "Text to video with synchronized audio. The frames (IMAGE) output is left unconnected, so no frames are decoded.")

# 2. first / last frame
save("h3_first_last_frame.json", [
    ENGINE,
    dict(id=2, type="LoadImage", pos=[40, 320], size=[320, 360], widgets={"image": "h3_first_frame.png"}, ui_values=["image"]),
    dict(id=3, type="LoadImage", pos=[40, 720], size=[320, 360], widgets={"image": "h3_last_frame.png"}, ui_values=["image"]),
    dict(id=4, type="H3Generate", pos=[420, 80], size=[400, 640], widgets={
        "prompt": "Scene: a red fox in a snowy pine forest.\nAction: the fox walks from the first pose to the last.\n"
                  "Camera: static medium shot.\nLook: natural winter light.\nAudio: soft footsteps in snow, light wind.",
        "preset": "balanced", "width": 512, "height": 512, "length_unit": "frames", "frames": 56, "seed": 42}),
    dict(id=5, type="SaveVideo", pos=[860, 80], size=[460, 420], widgets={"filename_prefix": "video/h3_anchored"}),
], [(1, 0, 4, "engine"), (2, 0, 4, "first_frame"), (3, 0, 4, "last_frame"), (4, 0, 5, "video")],
   "First/last-frame anchors (FL2VA). Put h3_first_frame.png and h3_last_frame.png in ComfyUI/input.")

# 3. references
save("h3_references.json", [
    ENGINE,
    dict(id=2, type="LoadImage", pos=[40, 320], size=[320, 360], widgets={"image": "h3_reference.png"}, ui_values=["image"]),
    dict(id=3, type="H3References", pos=[400, 320], size=[300, 160], widgets={"kind": "image"}),
    dict(id=4, type="LoadAudio", pos=[40, 740], size=[320, 140], widgets={"audio": "h3_reference_music.wav"}, ui_values=[None, ""]),
    dict(id=5, type="H3References", pos=[400, 560], size=[300, 160], widgets={"kind": "audio"}),
    dict(id=6, type="H3Generate", pos=[740, 80], size=[400, 640], widgets={
        "prompt": "Scene: the animal from <Picture 1> in its setting.\nAction: it walks toward the camera.\n"
                  "Camera: slow push-in.\nLook: as in <Picture 1>.\nAudio: the music of <Audio 1>.",
        "preset": "balanced", "width": 512, "height": 512, "length_unit": "frames", "frames": 56, "seed": 42}),
    dict(id=7, type="SaveVideo", pos=[1180, 80], size=[460, 420], widgets={"filename_prefix": "video/h3_references"}),
], [(1, 0, 6, "engine"), (2, 0, 3, "image"), (3, 0, 5, "previous"), (4, 0, 5, "audio"), (5, 0, 6, "references"),
    (6, 0, 7, "video")],
   "Ordered references (Ref2VA): an image then an audio reference. Put h3_reference.png and "
   "h3_reference_music.wav (2-15 s) in ComfyUI/input. Needs the model's Ref2VA folder.")
