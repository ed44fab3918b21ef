"""What each upstream h3 phase costs on the reference job: one table, read by two consumers.

Seconds on an M1 Ultra for the reference job (864x480, 20 steps, all 50 DiT layers); upstream
issue 17 gives text encoder 10.5 s, DiT load 18.3 s (AdaLN 3.0 + core 15.3) and the denoise loop
86.6 s, measured over 12 latent frames of video rows (REFERENCE_VIDEO_ROWS; the loop scales with
the rows, so 56 frames, 17 latent frames, take 17/12 of it); the rest are plausible small costs.

Two things are built from it, and neither may have its own copy of these numbers:
- h3bridge.progress weights the phases with it, to turn h3's per-phase counters into one overall
  fraction that follows elapsed time (the bridge needs it at run time, on a real Mac);
- h3-sim (h3bridge.sim.engine) sleeps by it, scaled to the job, to model upstream's timing.
It lives in its own module, not in the simulator, because the bridge must never import the
simulator at run time; and not in progress.py, because it is a fact about upstream, not about
how the bridge shows progress (the simulator would otherwise depend on the bridge's UI code).

Keys are h3's progress phase names (main.c cli_progress), plus work that reports nothing:
"video decode" (the tiled video-VAE decode after "video VAE load" 36/36), "preview decode" (one
per denoise step with a preview) and "media read" (each reference file read). "denoise" is the
sampling loop, whichever name reports it: the CPU sampler reports it as "denoise" step/steps;
the GPU sampler (an M5 device, h3_dit.c denoise_euler_gpu) reports the same loop as
"denoise enqueue" step/steps and then one final "denoise" steps/steps once the latents are read
back (with the default H3_GPU_SAMPLER_WINDOW=1 every step is submitted and waited for inside
the enqueue loop, so the loop's time is spent under "denoise enqueue").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .request import GenerationRequest

REFERENCE_SECONDS: dict[str, float] = {
    "tokenizer": 0.3,
    "media read": 0.2,
    "audio VAE encoder": 0.6,
    "video VAE encoder": 0.7,
    "Qwen vision": 1.1,
    "text encoder": 10.5,
    "refine text": 0.4,
    "precompute AdaLN": 3.0,
    "load transformer core": 15.3,
    "preview VAE load": 2.8,
    "denoise": 86.6,
    "preview decode": 0.6,
    "audio VAE": 1.6,
    "video VAE load": 2.8,
    "video decode": 7.5,
    "FFmpeg": 1.2,
}

# What the reference costs were measured over: the DiT's video rows (latent frames x 15 x 27
# patches) and the decoded pixels x frames.
REFERENCE_VIDEO_ROWS = 12 * (480 // 32) * (864 // 32)
REFERENCE_PIXEL_FRAMES = 864 * 480 * 56
REFERENCE_STEPS = 20
DIT_BLOCKS = 50                  # h3_dit_schedule.h:11
SKIPPED_STEP_SHARE = 0.05        # a step --denoise-reuse skips only extrapolates the velocity


@dataclass(frozen=True)
class JobShape:
    """What a job's phase costs scale with (h3_host.c h3_temporal / h3_latent_canvas values)."""

    render_width: int            # the DiT and VAE canvas
    render_height: int
    width: int                   # the delivered frames
    height: int
    frame_count: int
    video_t: int                 # latent frames
    audio_t: int                 # audio latent frames
    steps: int
    dit_layers: int = DIT_BLOCKS
    denoise_reuse: int = 1
    ssd_streaming: bool = False

    def load_core_seconds(self) -> float:
        seconds = REFERENCE_SECONDS["load transformer core"] * self.dit_layers / DIT_BLOCKS
        return seconds * 0.1 if self.ssd_streaming else seconds   # only norms + two stream slots

    def step_evaluated(self, step: int) -> bool:
        """h3_dit_reuse_schedule: the first, the last and every reuse-th step run the DiT."""
        return (self.denoise_reuse == 1 or step in (0, self.steps - 1)
                or step % self.denoise_reuse == 0)

    def denoise_step_seconds(self, step: int) -> float:
        rows = self.video_t * (self.render_height // 32) * (self.render_width // 32)
        seconds = (REFERENCE_SECONDS["denoise"] / REFERENCE_STEPS) * (rows / REFERENCE_VIDEO_ROWS) \
            * (self.dit_layers / DIT_BLOCKS)
        if self.ssd_streaming:
            seconds *= 1.5
        return seconds if self.step_evaluated(step) else seconds * SKIPPED_STEP_SHARE

    def audio_vae_seconds(self) -> float:
        return REFERENCE_SECONDS["audio VAE"] * self.audio_t / 93

    def video_decode_seconds(self) -> float:
        return REFERENCE_SECONDS["video decode"] * (self.render_width * self.render_height * self.frame_count) \
            / REFERENCE_PIXEL_FRAMES

    def ffmpeg_seconds(self) -> float:
        return REFERENCE_SECONDS["FFmpeg"] * (self.width * self.height * self.frame_count) / REFERENCE_PIXEL_FRAMES

    def phase_seconds(self, *, preview: bool = False) -> dict[str, float]:
        """Seconds per reported phase for the whole job, silent work included in the phase it
        follows (the tiled video decode runs unreported after "video VAE load" 36/36; a preview
        decode inside each denoise step). "denoise" is the sampling loop (module docstring).
        Reference encoders are taken at their reference cost: they scale with media the
        progress bar does not read."""
        loop = sum(self.denoise_step_seconds(step) for step in range(self.steps))
        if preview:
            loop += REFERENCE_SECONDS["preview decode"] * self.steps
        seconds = {phase: REFERENCE_SECONDS[phase] for phase in (
            "tokenizer", "audio VAE encoder", "video VAE encoder", "Qwen vision", "text encoder",
            "refine text", "precompute AdaLN", "preview VAE load")}
        seconds.update({"load transformer core": self.load_core_seconds(), "denoise": loop,
                        "audio VAE": self.audio_vae_seconds(),
                        "video VAE load": REFERENCE_SECONDS["video VAE load"] + self.video_decode_seconds(),
                        "FFmpeg": self.ffmpeg_seconds()})
        return seconds


def expected_phases(request: "GenerationRequest", *, writes_mp4: bool) -> dict[str, float]:
    """The upstream phases a job runs (h3.c h3_generate), in order, each with the seconds the
    upstream cost model expects it to take for this job: ProgressTracker's weights, and what a
    selftest calibration (history/calibration.py) scales to this machine's seconds."""
    # imported here: h3-sim reads this module's table and needs none of the bridge's request types
    from .geometry import audio_latent_t, video_latent_t
    from .progress import PHASE_ORDER
    from .request import ReferenceKind
    frames = request.frame_count
    shape = JobShape(render_width=request.render_width or request.width,
                     render_height=request.render_height or request.height,
                     width=request.width, height=request.height, frame_count=frames,
                     video_t=video_latent_t(frames), audio_t=audio_latent_t(frames),
                     steps=request.steps, dit_layers=request.layers, denoise_reuse=request.reuse,
                     ssd_streaming=request.ssd_streaming)
    seconds = shape.phase_seconds()
    phases = ["tokenizer", "text encoder", "refine text", "precompute AdaLN", "load transformer core",
              "denoise enqueue", "denoise", "audio VAE", "video VAE load"]
    visual = [r for r in request.references if r.kind is not ReferenceKind.AUDIO]
    if visual or request.first_frame is not None or request.last_frame is not None:
        phases += ["video VAE encoder", "Qwen vision"]
    if any(r.kind not in (ReferenceKind.IMAGE, ReferenceKind.SILENT_VIDEO) for r in request.references):
        phases.append("audio VAE encoder")
    if writes_mp4:
        phases.append("FFmpeg")
    # "denoise enqueue" is the GPU sampler's name for the same loop (module docstring)
    return {p: seconds["denoise" if p == "denoise enqueue" else p] for p in PHASE_ORDER if p in phases}


__all__ = ["REFERENCE_SECONDS", "JobShape", "DIT_BLOCKS", "expected_phases"]
