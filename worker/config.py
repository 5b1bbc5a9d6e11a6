"""Evaluation settings: gates, thresholds, repetitions, limits (one typed object, no env read here).

The bot's Settings (bot/settings.py) nests this as `settings.eval`; the worker receives it as
plain data with each job, so the GPU side never reads the bot's environment or secrets.
"""
from __future__ import annotations

from pydantic import BaseModel, Field


class EvalSettings(BaseModel):
    profile: str = "quick"  # quick | standard | full
    retries: int = Field(2, ge=0)  # automatic INFRA retries, with backoff
    retry_backoff_s: float = 30.0
    # Improvement tiers (relative speedup of the scored gate).
    tier_s: float = 0.02
    tier_m: float = 0.05
    tier_l: float = 0.15
    tier_xl: float = 0.40
    noise_floor_min: float = 0.02  # a change below this is never significant
