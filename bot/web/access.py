"""Who may see a repository's pages: public repositories to anyone; private ones only when the
deployment says so (`TOKENGATE_DASHBOARD_PRIVATE=show`, for a dashboard behind your own access control).

GitHub is asked once whether a repository is private; the answer is kept. Unknown (GitHub unreachable,
no installation) counts as private: the dashboard fails closed.
"""
from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from bot.db.models import Repository, RepositoryVisibility
from bot.settings import Settings

log = logging.getLogger(__name__)


def is_private(session: Session, repo: Repository) -> bool:
    row = session.get(RepositoryVisibility, repo.id)
    if row is not None:
        return row.private
    try:
        from bot.github.client import get_github_app
        if repo.installation_id is None:
            return True
        private = bool(get_github_app().client(repo.installation_id).get_repo(repo.full_name).private)
    except Exception as exc:  # noqa: BLE001 - any failure: treat as private, ask again next time
        log.warning("visibility of %s unknown (%s): treated as private", repo.full_name, exc)
        return True
    session.add(RepositoryVisibility(repository_id=repo.id, private=private))
    session.flush()
    return private


def may_view(session: Session, settings: Settings, repo: Repository) -> bool:
    return settings.dashboard_private == "show" or not is_private(session, repo)
