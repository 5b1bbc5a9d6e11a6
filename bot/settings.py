"""The service's one settings object (pydantic-settings, read lazily: nothing reads the environment at import).

Environment variables use the prefix `TOKENGATE_` (nested: `TOKENGATE_EVAL__PROFILE=full`).
Secrets may come from files (`TOKENGATE_PRIVATE_KEY_PATH`) so they never sit in an image.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url

from worker.config import EvalSettings

# Values that ship in examples and must never reach production.
PLACEHOLDER_SECRETS = {"", "changeme", "change-me", "replace-me", "secret", "xxx", "todo", "development"}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TOKENGATE_", env_nested_delimiter="__", extra="ignore")

    environment: Literal["development", "test", "production"] = "development"
    database_url: str = "sqlite:///tokengate.sqlite3"
    broker_url: str = "redis://127.0.0.1:6379/0"
    result_backend: str | None = None  # defaults to the broker
    redis_key_prefix: str = ""  # isolates several deployments (or test runs) on one Redis

    # GitHub App credentials (bot side only; the GPU side never sees them).
    github_api_url: str = "https://api.github.com"
    app_id: int | None = None
    webhook_secret: str = "development"
    private_key: str | None = None  # PEM text
    private_key_path: Path | None = None
    token_refresh_margin_s: float = Field(300.0, ge=0)  # refresh installation tokens this long before expiry
    # PyGithub throttling (GitHub asks for >= 1 s between content-creating writes); tests set both to 0.
    github_seconds_between_requests: float = Field(0.25, ge=0)
    github_seconds_between_writes: float = Field(1.0, ge=0)

    # Who may trigger.
    approval_label: str = "eval-approved"
    trusted_permissions: tuple[str, ...] = ("admin", "maintain", "write")
    permission_cache_s: float = Field(60.0, ge=0)

    # Evaluation.
    models: tuple[str, ...] = ()  # primary models to evaluate; empty = every model of the profile
    gpu_workers: int = Field(1, ge=1)  # used for the queue ETA
    eval: EvalSettings = Field(default_factory=EvalSettings)
    check_name: str = "tokengate"

    # Webhook intake and the delivery outbox (deliveries table, drained by the publish worker's beat).
    webhook_max_body_bytes: int = Field(25 * 1024 * 1024, ge=1)  # GitHub caps payloads at 25 MB
    webhook_store_timeout_s: float = Field(5.0, gt=0)  # not committed by then → 503 (GitHub waits 10 s)
    web_workers: int = Field(1, ge=1)  # `serve`'s uvicorn processes (each with its own outbox writer)
    broker_timeout_s: float = Field(1.0, gt=0)  # the web request never waits longer on Redis than this
    outbox_interval_s: float = Field(5.0, gt=0)  # beat: re-send deliveries not processed yet
    outbox_redrive_after_s: float = Field(30.0, gt=0)  # sent this long ago and not processed → sent again
    # A running handler's claim on its delivery: no other handle task takes it meanwhile; a handler that died
    # mid-way (after a commit stored its claim) is handled again once the claim has lapsed.
    handler_lease_s: float = Field(600.0, gt=0)
    # A live handler's claim is renewed (bot/queue/lease.py) for at most this long: one hung for good (a call with no
    # timeout) lets its delivery go to another handler then, rather than hold it for ever.
    handler_max_s: float = Field(1800.0, gt=0)
    # A delivery's retry that finds its own attempt nowhere in the broker sends it again only once it was stored
    # as sent this long ago: before that, its first handler may still be publishing it (the retry waits instead).
    send_in_flight_s: float = Field(30.0, ge=0)
    github_retry_for_s: float = Field(3600.0, gt=0)  # transient GitHub/network errors retried this long
    github_retry_max_backoff_s: float = Field(300.0, gt=0)
    metrics_port: int = Field(0, ge=0)  # publish worker's own /metrics (GitHub API errors, rate limit); 0 = off

    # GPU workers' result keys (bot side): {"gpu0": "<secret>"}; a result counts only when its HMAC verifies
    # with the key of the worker it names. A GPU worker holds only its own (TOKENGATE_WORKER_ID/_KEY).
    worker_keys: dict[str, str] = Field(default_factory=dict)

    # Watchdog (publish worker's beat): active evaluations whose task is gone become INFRA and are retried.
    # Defaults: a killed GPU worker's heartbeat lapses within 15 s, seen at the next 5 s tick (≤ ~21 s).
    watchdog_interval_s: float = Field(5.0, gt=0)
    watchdog_lost_after_s: float = Field(15.0, ge=0)  # no heartbeat / no queued message for this long = lost
    heartbeat_ttl_s: float = Field(15.0, ge=1)  # a running task's liveness key lapses this long after its worker
    eval_deadline_s: float = Field(4 * 3600.0, gt=0)  # running longer than this is a timeout, alive or not
    queue_deadline_s: float = Field(24 * 3600.0, gt=0)  # waiting longer than this is a timeout

    # Merge-first rounds.
    round_window_s: float = 7 * 24 * 3600.0
    merge_method: Literal["merge", "squash", "rebase"] = "squash"
    dry_run: bool = False

    # Dashboard, main's history and change points (issue 16; bot/web/pages.py, bot/history/).
    public_base_url: str | None = None  # e.g. https://tokengate.example.org: links in comments and check runs
    dashboard_private: Literal["off", "show"] = "off"  # private repositories' pages: 404, or shown to anyone
    history_enabled: bool = True  # measure each merge to the default branch, scan for change points, bisect
    history_profile: str | None = None  # profile of main measurements; None = eval.profile
    changepoint_min_step: float = Field(0.02, ge=0)  # smaller level shifts are not reported

    @model_validator(mode="after")
    def _no_placeholder_secrets(self) -> "Settings":
        if self.environment != "development" and self.webhook_secret.strip().lower() in PLACEHOLDER_SECRETS:
            raise ValueError(
                f"TOKENGATE_WEBHOOK_SECRET is a placeholder ({self.webhook_secret!r}) "
                f"but environment is {self.environment!r}: set a real secret"
            )
        password = make_url(self.database_url).password if "://" in self.database_url else None
        if self.environment != "development" and password is not None and \
                str(password).strip().lower() in PLACEHOLDER_SECRETS:
            raise ValueError(f"the password in TOKENGATE_DATABASE_URL is a placeholder ({password!r}) "
                             f"but environment is {self.environment!r}: set a real one")
        if self.watchdog_lost_after_s < self.heartbeat_ttl_s:
            raise ValueError(f"TOKENGATE_WATCHDOG_LOST_AFTER_S ({self.watchdog_lost_after_s}) must be at least "
                             f"TOKENGATE_HEARTBEAT_TTL_S ({self.heartbeat_ttl_s}): live tasks would look lost")
        return self

    def placeholder_secret(self) -> bool:
        return self.webhook_secret.strip().lower() in PLACEHOLDER_SECRETS

    def private_key_pem(self) -> str:
        """The App's private key; a clear error where the bot needs it and it is missing."""
        if self.private_key:
            return self.private_key
        if self.private_key_path:
            return self.private_key_path.read_text()
        raise ValueError("no GitHub App private key: set TOKENGATE_PRIVATE_KEY_PATH or TOKENGATE_PRIVATE_KEY")

    def require_github(self) -> None:
        if self.app_id is None:
            raise ValueError("TOKENGATE_APP_ID is not set")
        self.private_key_pem()

    @property
    def backend_url(self) -> str:
        return self.result_backend or self.broker_url


_override: list[Settings] = []


@functools.lru_cache(maxsize=1)
def _from_environment() -> Settings:
    return Settings()


def get_settings() -> Settings:
    """The process-wide settings: read from the environment once, on first use."""
    return _override[0] if _override else _from_environment()


def override_settings(settings: Settings | None) -> None:
    """Install explicit settings (tests, CLI); None forgets them so the environment is read again."""
    _override.clear()
    _from_environment.cache_clear()
    if settings is not None:
        _override.append(settings)
