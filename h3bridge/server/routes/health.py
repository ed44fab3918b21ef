"""GET /health: readiness (no key needed; says nothing about jobs)."""
from __future__ import annotations

from fastapi import APIRouter

from ...wire.videos import HEALTH_PATH
from ..state import State

router = APIRouter()


@router.get(HEALTH_PATH)
def health(state: State) -> dict[str, object]:
    settings = state.settings
    return {"status": "ok", "engine": settings.engine_name, "model": settings.model, "previews": settings.previews}
