"""h3bridge: MiniMax-H3 on Apple Silicon through antirez's native h3.c engine.

The public API is what this module exports; everything else is internal. docs/architecture.md
says which package owns what.
"""
from __future__ import annotations

# the vocabulary: requests, results, progress, cancellation, errors
from .cancel import CancelToken
from .errors import (
    EngineCrashedError,
    EngineError,
    EngineNotFoundError,
    EngineStalledError,
    GenerationCancelled,
    H3BridgeError,
    IntegrityError,
    MediaError,
    MemoryPlanError,
    ModelError,
    OutputExistsError,
    RemoteAuthError,
    RemoteError,
    RemoteUnreachableError,
    RequestError,
    SessionCommandError,
    SessionError,
    SessionUnsupportedError,
    UnsupportedRequestError,
)
from .geometry import align_frame_count
from .progress import PreviewFrame, ProgressEvent
from .prompt import StructuredPrompt, clean_prompt_text
from .request import PRESETS, GenerationRequest, Reference, ReferenceImageSize, ReferenceKind, SlowerPath
from .result import GenerationResult
# the engines (engines/)
from .engines.lock import engine_lock
from .engines.locate import locate_engine
from .engines.oneshot import OneShotEngine
from .engines.process import EngineProcess
from .engines.protocol import Engine, EngineCapabilities
from .engines.session import SessionEngine, shared_session
from .engines.library import LibraryEngine
# the model directory (model/) and media (media/)
from .media.references import AudioClip, ReferenceItem, ReferenceList, VideoSource, materialise_references
from .model.inventory import ModelInventory, inspect_model
from .model.memory import MachineFacts, MemoryPlan, plan_memory, preflight
from .model.verify import VerifyReport, verify_model
# long-form: storyboards of chained shots (story/)
from .story import Storyboard, StoryResult, run_story

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # RemoteEngine needs httpx and pydantic, which nothing local does: a ComfyUI whose Python
    # lacks them still loads the node pack, and only the remote mode says what is missing.
    if name == "RemoteEngine":
        from .engines.remote import RemoteEngine
        return RemoteEngine
    raise AttributeError(f"module 'h3bridge' has no attribute {name!r}")

__all__ = [
    "CancelToken", "EngineCrashedError", "EngineError", "EngineNotFoundError", "EngineStalledError",
    "GenerationCancelled", "GenerationRequest", "GenerationResult", "H3BridgeError", "IntegrityError",
    "MediaError", "MemoryPlanError", "ModelError", "OutputExistsError", "PRESETS", "PreviewFrame", "ProgressEvent",
    "Reference", "ReferenceImageSize", "ReferenceKind", "RequestError", "SessionError", "SlowerPath",
    "UnsupportedRequestError", "align_frame_count",
    # the engines: the protocol, one-shot, the warm session, the machine-wide engine lock (engines/)
    "Engine", "EngineCapabilities", "EngineProcess", "OneShotEngine", "locate_engine",
    "SessionEngine", "shared_session", "LibraryEngine", "SessionCommandError", "SessionUnsupportedError", "engine_lock",
    # a Videos API server (h3bridge serve, SGLang Diffusion, vLLM-Omni) as an engine (engines/remote.py)
    "RemoteEngine", "RemoteError", "RemoteAuthError", "RemoteUnreachableError",
    # model inventory, verification and memory plan (model/)
    "ModelInventory", "inspect_model", "VerifyReport", "verify_model", "MachineFacts", "MemoryPlan",
    "plan_memory", "preflight",
    # prompt building and in-memory media -> reference files (prompt.py, media/references.py)
    "StructuredPrompt", "clean_prompt_text", "AudioClip", "ReferenceItem", "ReferenceList", "VideoSource",
    "materialise_references",
    # storyboards of chained shots, resumable, assembled into one film (story/)
    "Storyboard", "StoryResult", "run_story",
]
