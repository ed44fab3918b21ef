"""h3bridge: MiniMax-H3 on Apple Silicon through antirez's native h3.c engine.

The public API is what this module exports; everything else is internal. docs/architecture.md
says which package owns what.

Every public name is imported when it is first used (PEP 562), not when `h3bridge` is: the package
is also the parent of h3-sim (`h3bridge.sim`), which the engine's callers launch once per job and
which needs none of the engines, media decoding or storyboards. `from h3bridge import X`,
`h3bridge.X` and `h3bridge.__all__` work as if everything were imported here.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# Public name -> the module (relative to this package) that defines it.
_PUBLIC: dict[str, str] = {
    # the vocabulary: requests, results, progress, cancellation, errors
    "CancelToken": ".cancel", "PauseControl": ".cancel",
    **{name: ".errors" for name in (
        "EngineCrashedError", "EngineError", "EngineNotFoundError", "EngineStalledError",
        "GenerationCancelled", "H3BridgeError", "IntegrityError", "MediaError", "MemoryPlanError",
        "ModelError", "OutputExistsError", "RemoteAuthError", "RemoteError", "RemoteUnreachableError",
        "RequestError", "SessionCommandError", "SessionError", "SessionUnsupportedError",
        "UnsupportedRequestError")},
    "align_frame_count": ".geometry",
    "PreviewFrame": ".progress", "ProgressEvent": ".progress",
    "StructuredPrompt": ".prompt", "clean_prompt_text": ".prompt",
    **{name: ".request" for name in (
        "PRESETS", "GenerationRequest", "Reference", "ReferenceImageSize", "ReferenceKind", "SlowerPath")},
    "GenerationResult": ".result",
    # the engine choice, one spelling in every interface: one-shot, session, library, remote
    "EngineKind": ".vocabulary",
    # the engines (engines/)
    "engine_lock": ".engines.lock",
    "locate_engine": ".engines.locate",
    "OneShotEngine": ".engines.oneshot",
    "EngineProcess": ".engines.process",
    "Engine": ".engines.protocol", "EngineCapabilities": ".engines.protocol",
    "SessionEngine": ".engines.session", "shared_session": ".engines.session",
    "LibraryEngine": ".engines.library",
    # RemoteEngine needs httpx and pydantic, which nothing local does: a ComfyUI whose Python
    # lacks them still loads the node pack, and only the remote mode says what is missing.
    "RemoteEngine": ".engines.remote",
    # the model directory (model/) and media (media/)
    **{name: ".media.references" for name in (
        "AudioClip", "ReferenceItem", "ReferenceList", "VideoSource", "materialise_references")},
    "ModelInventory": ".model.inventory", "inspect_model": ".model.inventory",
    **{name: ".model.memory" for name in ("MachineFacts", "MemoryPlan", "plan_memory", "preflight")},
    "VerifyReport": ".model.verify", "verify_model": ".model.verify",
    # long-form: storyboards of chained shots (story/)
    "Storyboard": ".story", "StoryResult": ".story", "run_story": ".story",
    # takes: one request with several seeds, and their contact sheet (takes.py)
    "TakesResult": ".takes", "generate_takes": ".takes",
}

if TYPE_CHECKING:  # what type checkers and editors resolve the lazy names to (the same as _PUBLIC)
    from .cancel import CancelToken, PauseControl
    from .engines.library import LibraryEngine
    from .engines.locate import locate_engine
    from .engines.lock import engine_lock
    from .engines.oneshot import OneShotEngine
    from .engines.process import EngineProcess
    from .engines.protocol import Engine, EngineCapabilities
    from .engines.remote import RemoteEngine
    from .engines.session import SessionEngine, shared_session
    from .errors import (EngineCrashedError, EngineError, EngineNotFoundError, EngineStalledError,
                         GenerationCancelled, H3BridgeError, IntegrityError, MediaError, MemoryPlanError,
                         ModelError, OutputExistsError, RemoteAuthError, RemoteError, RemoteUnreachableError,
                         RequestError, SessionCommandError, SessionError, SessionUnsupportedError,
                         UnsupportedRequestError)
    from .geometry import align_frame_count
    from .media.references import AudioClip, ReferenceItem, ReferenceList, VideoSource, materialise_references
    from .model.inventory import ModelInventory, inspect_model
    from .model.memory import MachineFacts, MemoryPlan, plan_memory, preflight
    from .model.verify import VerifyReport, verify_model
    from .progress import PreviewFrame, ProgressEvent
    from .prompt import StructuredPrompt, clean_prompt_text
    from .request import PRESETS, GenerationRequest, Reference, ReferenceImageSize, ReferenceKind, SlowerPath
    from .result import GenerationResult
    from .story import Storyboard, StoryResult, run_story
    from .takes import TakesResult, generate_takes
    from .vocabulary import EngineKind

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    module = _PUBLIC.get(name)
    if module is None:
        # AttributeError (not ImportError): `from h3bridge import libh3` then imports the submodule
        raise AttributeError(f"module 'h3bridge' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value     # looked up once; later uses are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))


__all__ = [
    "CancelToken", "PauseControl", "EngineCrashedError", "EngineError", "EngineNotFoundError", "EngineStalledError",
    "GenerationCancelled", "GenerationRequest", "GenerationResult", "H3BridgeError", "IntegrityError",
    "MediaError", "MemoryPlanError", "ModelError", "OutputExistsError", "PRESETS", "PreviewFrame", "ProgressEvent",
    "Reference", "ReferenceImageSize", "ReferenceKind", "RequestError", "SessionError", "SlowerPath",
    "UnsupportedRequestError", "align_frame_count",
    # the engine choice (vocabulary.py), and the engines: the protocol, one-shot, the warm session, the machine-wide engine lock (engines/)
    "EngineKind", "Engine", "EngineCapabilities", "EngineProcess", "OneShotEngine", "locate_engine",
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
    # takes of one request with several seeds, and their contact sheet (takes.py)
    "TakesResult", "generate_takes",
]
