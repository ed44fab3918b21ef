"""h3bridge: MiniMax-H3 on Apple Silicon through antirez's native h3.c engine.

The public API is what this module exports; everything else is internal.
"""
from __future__ import annotations

from .cancel import CancelToken
from .engines.oneshot import OneShotEngine
from .engines.locate import locate_engine
from .engines.process import EngineProcess
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
    RequestError,
    SessionCommandError,
    SessionError,
    SessionUnsupportedError,
)
from .engines.lock import engine_lock
from .model.memory import MachineFacts, MemoryPlan, plan_memory, preflight
from .model.inventory import ModelInventory, inspect_model
from .progress import ProgressEvent
from .prompt import StructuredPrompt, clean_prompt_text
from .media.references import AudioClip, ReferenceItem, ReferenceList, VideoSource, materialise_references
from .request import (
    PRESETS,
    GenerationRequest,
    Reference,
    ReferenceImageSize,
    ReferenceKind,
    SlowerPath,
    align_frame_count,
)
from .result import GenerationResult
from .engines.session import SessionEngine, shared_session
from .model.verify import VerifyReport, verify_model

__version__ = "0.1.0"

__all__ = [
    "CancelToken", "EngineProcess", "OneShotEngine", "locate_engine", "EngineCrashedError", "EngineError", "EngineNotFoundError", "EngineStalledError",
    "GenerationCancelled", "GenerationRequest", "GenerationResult", "H3BridgeError", "IntegrityError",
    "MediaError", "MemoryPlanError", "ModelError", "OutputExistsError", "PRESETS", "ProgressEvent",
    "Reference", "ReferenceImageSize", "ReferenceKind", "RequestError", "SessionError", "SlowerPath",
    "align_frame_count",
    # warm session and the machine-wide engine lock (session.py, lock.py)
    "SessionEngine", "shared_session", "SessionCommandError", "SessionUnsupportedError", "engine_lock",
    # model inventory, verification and memory plan (model.py, verify.py, memory.py)
    "ModelInventory", "inspect_model", "VerifyReport", "verify_model", "MachineFacts", "MemoryPlan",
    "plan_memory", "preflight",
    # prompt building and in-memory media -> reference files (prompt.py, reference_files.py)
    "StructuredPrompt", "clean_prompt_text", "AudioClip", "ReferenceItem", "ReferenceList", "VideoSource",
    "materialise_references",
]
