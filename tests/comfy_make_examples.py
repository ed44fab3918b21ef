"""Regenerate example_workflows/*.json (ComfyUI's UI format) from a running ComfyUI's /object_info,
so widget values line up with the current node schemas, and their template thumbnails:

    python tests/comfy_make_examples.py http://127.0.0.1:8188            # the workflows
    python tests/comfy_make_examples.py http://127.0.0.1:8188 --thumbnails
        # also example_workflows/NAME.jpg: the workflow as ComfyUI's own frontend draws it (headless
        # Chromium through comfy_frontend_load.py; run with a python that has aiohttp, ComfyUI's)

Every example runs as shipped: the inputs it needs are made by core nodes (Empty Image, Empty
Audio) titled "replace with Load Image/Audio", since a custom node pack has no way to ship files
into ComfyUI/input. Prompts are one line, so a warm session takes them.
"""
import json
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from comfy_workflows import build_ui_workflow  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "example_workflows"
# ComfyUI's template browser shows custom-node templates as image/jpg: it loads
# /api/workflow_templates/<pack>/<NAME>.jpg, served from example_workflows/ (app/custom_node_manager.py).
THUMBNAIL_WIDTH = 640

# H3 Engine (H3EngineV2: only the chosen mode's inputs) is drawn well under 280 px tall with its
# title: nodes below it start at y=360.
ENGINE = dict(id=1, type="H3EngineV2", pos=[40, 80], size=[380, 160],
              widgets={"mode": "one-shot", "mode.engine_path": "", "mode.model_dir": "MiniMax-H3"})


def generate_node(node_id: int, pos: list[int], prompt: str, **widgets: object) -> dict:
    values = {"prompt": prompt, "preset": "balanced", "width": 512, "height": 512, "length_unit": "frames",
              "length_unit.frames": 56, "seed": 42, "seed:control": "fixed", **widgets}
    return dict(id=node_id, type="H3Generate", pos=pos, size=[420, 720], widgets=values)


def workflows() -> dict[str, tuple[list, list, str]]:
    text_to_video = ([
        ENGINE,
        dict(id=2, type="H3Prompt", pos=[20, 360], size=[420, 620], widgets={
            "scene": "a single red fox in a snow-covered pine forest at dawn.",
            "action": "the fox walks steadily left to right and looks toward the camera once.",
            "camera": "medium-height lateral tracking shot, 50 mm lens, stable framing.",
            "look": "photorealistic fur, cold blue ambient light, warm sunrise rim light.",
            "audio": "soft footsteps in snow, light wind through pine branches, no music."}),
        generate_node(3, [460, 80], "", width=864, height=480, length_unit="seconds",
                      **{"length_unit.seconds": 4.0}),
        # Save Video grows downwards when its preview loads; Preview as Text sits beside it, not below.
        dict(id=4, type="SaveVideo", pos=[920, 80], size=[480, 420], widgets={"filename_prefix": "video/h3_fox"}),
        dict(id=5, type="PreviewAny", pos=[1440, 80], size=[420, 420], title="Summary (Preview as Text)"),
    ], [(1, 0, 3, "engine"), (2, 0, 3, "prompt"), (3, 0, 4, "video"), (3, 3, 5, "source")],
        "Text to video with synchronized audio. The frames (IMAGE) output is left unconnected, so no frames "
        "are decoded.")

    first_last = ([
        ENGINE,
        dict(id=2, type="EmptyImage", pos=[40, 360], size=[380, 160], title="First frame (replace with Load Image)",
             widgets={"width": 512, "height": 512, "batch_size": 1, "color": 0xD8642A}),
        dict(id=3, type="EmptyImage", pos=[40, 570], size=[380, 160], title="Last frame (replace with Load Image)",
             widgets={"width": 512, "height": 512, "batch_size": 1, "color": 0x2A4FD8}),
        generate_node(4, [460, 80], "Scene: a glowing sunset sky over a calm sea. Action: the warm orange light "
                                    "slowly fades into deep blue dusk. Camera: static wide shot. Look: soft "
                                    "gradients, gentle film grain. Audio: quiet waves, a distant gull, no music."),
        dict(id=5, type="SaveVideo", pos=[920, 80], size=[480, 480],
             widgets={"filename_prefix": "video/h3_anchored"}),
    ], [(1, 0, 4, "engine"), (2, 0, 4, "first_frame"), (3, 0, 4, "last_frame"), (4, 0, 5, "video")],
        "First/last-frame anchors (FL2VA): the clip starts on the first image and ends on the last. The "
        "example makes two plain colour images; replace them with Load Image for your own frames.")

    references = ([
        ENGINE,
        dict(id=2, type="EmptyImage", pos=[40, 360], size=[380, 160],
             title="Reference picture (replace with Load Image)",
             widgets={"width": 512, "height": 512, "batch_size": 1, "color": 0x3C8D5A}),
        dict(id=3, type="H3References", pos=[40, 570], size=[380, 160], widgets={"kind": "image"}),
        dict(id=4, type="EmptyAudio", pos=[40, 780], size=[380, 120],
             title="Reference audio, 4 s of silence (replace with Load Audio)",
             widgets={"duration": 4.0, "sample_rate": 44100, "channels": 2}),
        dict(id=5, type="H3References", pos=[40, 950], size=[380, 160], widgets={"kind": "audio"}),
        generate_node(6, [460, 80], "Scene: the green meadow of <Picture 1> under an open sky. Action: tall grass "
                                    "sways in a light breeze. Camera: slow push-in. Look: as in <Picture 1>. "
                                    "Audio: the quiet of <Audio 1>."),
        dict(id=7, type="SaveVideo", pos=[920, 80], size=[480, 480],
             widgets={"filename_prefix": "video/h3_references"}),
    ], [(1, 0, 6, "engine"), (2, 0, 3, "image"), (3, 0, 5, "previous"), (4, 0, 5, "audio"), (5, 0, 6, "references"),
        (6, 0, 7, "video")],
        "Ordered references (Ref2VA): a picture, then an audio reference; the prompt names them <Picture 1> and "
        "<Audio 1>. Replace the generated inputs with Load Image / Load Audio (2-15 s). Needs the model's "
        "Ref2VA folder.")
    return {"h3_text_to_video_audio.json": text_to_video, "h3_first_last_frame.json": first_last,
            "h3_references.json": references}


def write_thumbnails(url: str, paths: list[Path]) -> None:
    with tempfile.TemporaryDirectory() as shots:
        subprocess.run([sys.executable, str(Path(__file__).with_name("comfy_frontend_load.py")), url,
                        "--screenshots", shots, *map(str, paths)], check=True, stdout=subprocess.DEVNULL)
        for path in paths:
            thumbnail = path.with_suffix(".jpg")
            subprocess.run(["ffmpeg", "-v", "error", "-y", "-i", str(Path(shots) / (path.stem + ".png")),
                            # without the frontend's side bar, tab row and canvas buttons: the graph only
                            "-vf", f"crop=iw-80:ih-190:80:100,scale={THUMBNAIL_WIDTH}:-2", "-q:v", "4",
                            str(thumbnail)], check=True)
            print("wrote", thumbnail)


def main() -> None:
    url = sys.argv[1]
    with urllib.request.urlopen(url + "/object_info", timeout=60) as response:
        info = json.load(response)
    written = []
    for name, (nodes, links, note) in workflows().items():
        workflow = build_ui_workflow(nodes, links, info, extra={"h3bridge": note})
        path = EXAMPLES / name
        path.write_text(json.dumps(workflow, indent=1) + "\n")
        written.append(path)
        print("wrote", path)
    if "--thumbnails" in sys.argv[2:]:
        write_thumbnails(url, sorted(EXAMPLES.glob("*.json")))     # every example, also those made by hand


if __name__ == "__main__":
    main()
