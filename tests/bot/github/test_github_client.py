"""GitHub App auth against our server: JWT → installation token, reused, refreshed before expiry;
and the server's responses have GitHub's shapes (githubkit's models, test-only)."""
from __future__ import annotations

import time

import pytest

from bot.github.client import GitHubApp
from bot.settings import Settings
from tests.bot.conftest import APP_ID, INSTALLATION_ID


def app_for(github, rsa_key, margin: float) -> GitHubApp:
    return GitHubApp(Settings(app_id=APP_ID, private_key=rsa_key[0], github_api_url=github.base_url,
                              github_seconds_between_requests=0, github_seconds_between_writes=0,
                              token_refresh_margin_s=margin, permission_cache_s=0.3))


def test_installation_token_is_cached_then_refreshed_before_expiry(github, rsa_key):
    github.token_ttl_s = 3.0
    app = app_for(github, rsa_key, margin=1.5)
    t1 = app.installation_token(INSTALLATION_ID)
    assert app.installation_token(INSTALLATION_ID) == t1  # 3 s left > 1.5 s margin: reused
    assert len(github.requests_for("apps/create-installation-access-token")) == 1
    time.sleep(1.7)  # now inside the margin, still valid on the server
    t2 = app.installation_token(INSTALLATION_ID)
    assert t2 != t1 and len(github.requests_for("apps/create-installation-access-token")) == 2
    # The fresh token works; the JWT the server saw was signed by our key for our App id.
    repo = app.client(INSTALLATION_ID).get_repo("Codertocat/Hello-World")
    assert repo.default_branch == "main"


def test_expired_token_is_refused_by_the_server(github, rsa_key):
    github.token_ttl_s = 0.5
    app = app_for(github, rsa_key, margin=0)
    gh = app.client(INSTALLATION_ID)
    time.sleep(0.6)
    from github import GithubException
    with pytest.raises(GithubException) as exc:
        gh.get_repo("Codertocat/Hello-World").default_branch  # noqa: B018
    assert exc.value.status == 401
    # Asking the App again gives a working client.
    assert app.client(INSTALLATION_ID).get_repo("Codertocat/Hello-World").default_branch == "main"


def test_forged_jwt_is_refused(github, rsa_key):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    from github import GithubException
    with pytest.raises(GithubException) as exc:
        app_for(github, (other, None), margin=0).installation_token(INSTALLATION_ID)
    assert exc.value.status == 401


def test_permissions_are_cached_briefly(github, rsa_key):
    app = app_for(github, rsa_key, margin=60)
    assert app.is_trusted(INSTALLATION_ID, "Codertocat/Hello-World", "maintainer")
    assert not app.is_trusted(INSTALLATION_ID, "Codertocat/Hello-World", "outsider")
    assert not app.is_trusted(INSTALLATION_ID, "Codertocat/Hello-World", "stranger")  # 404: not a collaborator
    app.is_trusted(INSTALLATION_ID, "Codertocat/Hello-World", "maintainer")
    assert len(github.requests_for("repos/get-collaborator-permission-level")) == 3
    time.sleep(0.35)
    github.repos["codertocat/hello-world"].permissions["maintainer"] = "read"  # demoted
    assert not app.is_trusted(INSTALLATION_ID, "Codertocat/Hello-World", "maintainer")


MODELS = {
    "apps/create-installation-access-token": "InstallationToken",
    "apps/get-authenticated": "Integration",
    "repos/get": "FullRepository",
    "pulls/get": "PullRequest",
    "pulls/merge": "PullRequestMergeResult",
    "issues/get": "Issue",
    "issues/list-comments": ["IssueComment"],
    "issues/create-comment": "IssueComment",
    "issues/update-comment": "IssueComment",
    "issues/add-labels": ["Label"],
    "issues/set-labels": ["Label"],
    "issues/remove-label": ["Label"],
    "checks/create": "CheckRun",
    "checks/update": "CheckRun",
    "repos/get-collaborator-permission-level": "RepositoryCollaboratorPermission",
    "repos/get-combined-status-for-ref": "CombinedCommitStatus",
    "checks/list-for-ref": "ReposOwnerRepoCommitsRefCheckRunsGetResponse200",
}


def test_every_response_has_githubs_shape(settings, celery_worker, github, remote, send):
    """Drive the whole flow (eval, labels, comments, a merge-first round), then validate every 2xx body the
    server sent with githubkit's pydantic models of GitHub's REST schemas."""
    models = pytest.importorskip("githubkit_schemas.latest.models", reason="githubkit (test extra) not installed")
    from pydantic import TypeAdapter

    from tests.bot.conftest import comment_payload, pr_payload, wait_until
    from tests.bot.helpers import finished
    from tests.bot.test_rounds import close
    remote.commit("changes", "go (xl)")
    send("pull_request", pr_payload(github, remote, "opened", author="outsider"))
    send("issue_comment", comment_payload(github, 2, "/eval", "maintainer"))
    wait_until(finished(1), what="evaluation")
    github.repos["codertocat/hello-world"].pulls[2].labels.append("eval-approved")
    remote.commit("changes", "more (xl:20)")
    send("pull_request", pr_payload(github, remote, "synchronize", author="outsider"))  # removes approval
    wait_until(lambda: github.requests_for("issues/remove-label"), what="approval removed")
    send("issue_comment", comment_payload(github, 2, "/eval", "maintainer"))
    wait_until(finished(2), what="second evaluation")
    assert close(dry_run=False).winner == 2
    extra = app_for(github, (settings.private_key, None), margin=60)
    extra._integration.get_app()
    assert extra.client(INSTALLATION_ID).get_repo("Codertocat/Hello-World").default_branch == "main"

    seen = set()
    for rec in github.requests:
        if rec.status >= 300 or rec.operation not in MODELS:
            continue
        spec = MODELS[rec.operation]
        model = list[getattr(models, spec[0])] if isinstance(spec, list) else getattr(models, spec)
        TypeAdapter(model).validate_python(rec.response)
        seen.add(rec.operation)
    assert seen == set(MODELS), sorted(set(MODELS) - seen)
