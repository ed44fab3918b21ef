"""h3bridge: MiniMax-H3 on Apple Silicon through antirez's native h3.c engine.

The public API is what this module exports; everything else is internal.
"""
from __future__ import annotations

from .cancel import CancelToken
from .engine import OneShotEngine, locate_engine
from .engine_process import EngineProcess
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
from .lock import engine_lock
from .memory import MachineFacts, MemoryPlan, plan_memory, preflight
from .model import ModelInventory, inspect_model
from .progress import ProgressEvent
from .prompt import StructuredPrompt, clean_prompt_text
from .reference_files import AudioClip, ReferenceItem, ReferenceList, VideoSource, materialise_references
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
from .session import SessionEngine, shared_session
from .verify import VerifyReport, verify_model

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
