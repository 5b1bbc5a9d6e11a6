"""Who may see a repository's pages: public repositories to anyone; private ones only when the
deployment says so (`TOKENGATE_DASHBOARD_PRIVATE=show`, for a dashboard behind your own access control).

GitHub is asked whether a repository is private; the answer is kept for RECHECK_S, then asked again (a
repository made private stops showing within that time). Unknown (GitHub unreachable, no installation)
counts as private: the dashboard fails closed.
"""
from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy.orm import Session

from bot.db.models import Repository, RepositoryVisibility, utcnow
from bot.settings import Settings

log = logging.getLogger(__name__)

RECHECK_S = 600


def is_private(session: Session, repo: Repository) -> bool:
    row = session.get(RepositoryVisibility, repo.id)
    if row is not None and utcnow() - row.checked_at < timedelta(seconds=RECHECK_S):
        return row.private
    try:
        from bot.github.client import get_github_app
        if repo.installation_id is None:
            return True
        private = bool(get_github_app().client(repo.installation_id).get_repo(repo.full_name).private)
    except Exception as exc:  # noqa: BLE001 - any failure: treat as private, ask again next time
        log.warning("visibility of %s unknown (%s): treated as private", repo.full_name, exc)
        return True
    if row is None:
        session.add(RepositoryVisibility(repository_id=repo.id, private=private))
    else:
        row.private, row.checked_at = private, utcnow()
    session.flush()
    return private


def may_view(session: Session, settings: Settings, repo: Repository) -> bool:
    return settings.dashboard_private == "show" or not is_private(session, repo)
