"""GitHub App authentication and the few REST calls the service makes, through PyGithub.

JWT (signed with the App's key) → installation access token, cached per installation and
refreshed `token_refresh_margin_s` before it expires. Permission look-ups are cached briefly.
Only the bot side (webhook + `publish` queue) ever builds one of these.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from github import Auth, Github, GithubException, GithubIntegration

from bot.settings import Settings


@dataclass
class _Token:
    token: str
    expires_at: datetime


class GitHubApp:
    def __init__(self, settings: Settings):
        settings.require_github()
        self.settings = settings
        self._lock = threading.Lock()
        self._tokens: dict[int, _Token] = {}
        self._permissions: dict[tuple[str, str], tuple[str, float]] = {}
        self._integration = GithubIntegration(
            auth=Auth.AppAuth(settings.app_id, settings.private_key_pem()),
            base_url=settings.github_api_url,
            **self._throttle(),
        )
        self._clients: dict[int, tuple[str, Github]] = {}
        self._login: str | None = None

    def _throttle(self) -> dict:
        s = self.settings
        return {"seconds_between_requests": s.github_seconds_between_requests,
                "seconds_between_writes": s.github_seconds_between_writes}

    def installation_token(self, installation_id: int) -> str:
        """A valid installation token, fetched again when it is within the refresh margin of expiring."""
        with self._lock:
            cached = self._tokens.get(installation_id)
            now = datetime.now(timezone.utc)
            if cached and (cached.expires_at - now).total_seconds() > self.settings.token_refresh_margin_s:
                return cached.token
            auth = self._integration.get_access_token(installation_id)
            expires = auth.expires_at
            if expires.tzinfo is None:
                expires = expires.replace(tzinfo=timezone.utc)
            self._tokens[installation_id] = _Token(auth.token, expires)
            return auth.token

    def bot_login(self) -> str:
        """The login our comments are written under ("<slug>[bot]"), asked of GitHub once."""
        if self._login is None:
            self._login = f"{self._integration.get_app().slug}[bot]"
        return self._login

    def client(self, installation_id: int) -> Github:
        token = self.installation_token(installation_id)
        with self._lock:
            cached = self._clients.get(installation_id)
            if cached and cached[0] == token:
                return cached[1]
            gh = Github(auth=Auth.Token(token), base_url=self.settings.github_api_url, retry=2, lazy=True,
                        **self._throttle())
            self._clients[installation_id] = (token, gh)
            return gh

    def permission(self, installation_id: int, repo_full_name: str, login: str) -> str:
        """`admin` | `maintain` | `write` | `triage` | `read` | `none`, cached for `permission_cache_s`."""
        key = (repo_full_name.lower(), login.lower())
        with self._lock:
            hit = self._permissions.get(key)
            if hit and time.monotonic() - hit[1] < self.settings.permission_cache_s:
                return hit[0]
        repo = self.client(installation_id).get_repo(repo_full_name)
        try:
            data = repo.get_collaborator_permission(login)
        except GithubException as exc:
            if exc.status != 404:  # 404: not a collaborator at all
                raise
            data = "none"
        # role_name carries custom roles (maintain/triage); permission is the legacy admin|write|read|none.
        perm = str(data)
        with self._lock:
            self._permissions[key] = (perm, time.monotonic())
        return perm

    def is_trusted(self, installation_id: int, repo_full_name: str, login: str) -> bool:
        return self.permission(installation_id, repo_full_name, login) in self.settings.trusted_permissions


_app: list[GitHubApp] = []
_app_lock = threading.Lock()


def get_github_app() -> GitHubApp:
    from bot.settings import get_settings
    with _app_lock:
        if not _app:
            _app.append(GitHubApp(get_settings()))
        return _app[0]


def reset_github_app() -> None:
    with _app_lock:
        _app.clear()
