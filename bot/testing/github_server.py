"""A GitHub REST server of our own, on 127.0.0.1, for the endpoints the bot calls.

Bodies start from GitHub's documented example responses (shared/github/rest-api-subset.json)
with our state written over them; every URL in them points back at this server. Branch and
commit SHAs come from real git repositories on disk, and a merge is a real git merge. Every
request and response is recorded so tests can assert on what the bot did (and validate the
shapes against githubkit's models).
"""
from __future__ import annotations

import copy
import itertools
import json
import os
import re
import secrets
import subprocess
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

import jwt
from bot.testing import GITHUB_FIXTURES as GITHUB

# shared/ lies beside the checkout (developer machines and CI alike).
SUBSET = GITHUB / "rest-api-subset.json"


def _examples() -> dict:
    doc = json.loads(SUBSET.read_text())
    return {k: v["value"] for k, v in doc["components"]["examples"].items()}


EXAMPLES = _examples()


def iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def git(path: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True, text=True).stdout.strip()


@dataclass
class Recorded:
    method: str
    path: str
    query: dict
    body: object
    status: int
    response: object
    operation: str


@dataclass
class PullState:
    number: int
    title: str
    author: str
    head_ref: str
    base_ref: str
    labels: list[str] = field(default_factory=list)
    state: str = "open"
    merged: bool = False
    merge_commit_sha: str | None = None
    updated_at: str | None = None  # GitHub's pull_request.updated_at (None: the example's)
    mergeable: bool = True  # False: GitHub refuses the merge (a conflict, branch protection, a draft)


@dataclass
class RepoState:
    id: int
    owner: str
    name: str
    path: Path  # the git repository (the PR remote)
    default_branch: str = "main"
    pulls: dict[int, PullState] = field(default_factory=dict)
    permissions: dict[str, str] = field(default_factory=dict)
    statuses: dict[str, list[dict]] = field(default_factory=dict)  # sha → [{context, state}]
    other_checks: dict[str, list[dict]] = field(default_factory=dict)  # sha → [{name, status, conclusion}]

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"


class FakeGitHub:
    app_slug = "tokengate"  # the App's comments are by "<slug>[bot]", as on GitHub

    def __init__(self, app_id: int, public_key_pem: str, installation_id: int = 1, token_ttl_s: float = 3600):
        self.app_id = app_id
        self.public_key_pem = public_key_pem
        self.installation_id = installation_id
        self.token_ttl_s = token_ttl_s
        self.repos: dict[str, RepoState] = {}
        self.comments: dict[int, dict] = {}
        self.check_runs: dict[int, dict] = {}
        self.tokens: dict[str, datetime] = {}
        self.requests: list[Recorded] = []
        self._ids = itertools.count(1000)
        self.lock = threading.RLock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    # ---- faults -------------------------------------------------------------------------------------
    outage_until: float = 0.0  # time.monotonic() before which every request gets a 503
    resets: int = 0  # the next N writes are reset (after the server applied them when resets_after_write)
    resets_after_write: bool = True
    outages_served: int = 0
    resets_done: int = 0

    def outage(self, seconds: float) -> None:
        import time
        self.outage_until = time.monotonic() + seconds

    def fault_for(self, method: str) -> str | None:
        import time
        with self.lock:
            if time.monotonic() < self.outage_until:
                self.outages_served += 1
                return "outage"
            if self.resets > 0 and method != "GET":
                self.resets -= 1
                self.resets_done += 1
                return "reset-after" if self.resets_after_write else "reset-before"
        return None

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "FakeGitHub":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # ---- state set-up helpers -------------------------------------------------------------------
    def add_repo(self, owner: str, name: str, path: Path, repo_id: int = 1296269) -> RepoState:
        repo = RepoState(id=repo_id, owner=owner, name=name, path=path)
        self.repos[repo.full_name.lower()] = repo
        return repo

    def sha(self, repo: RepoState, ref: str) -> str:
        return git(repo.path, "rev-parse", ref)

    def requests_for(self, operation: str) -> list[Recorded]:
        with self.lock:
            return [r for r in self.requests if r.operation == operation]

    def comments_on(self, repo: RepoState, number: int) -> list[dict]:
        with self.lock:
            return [c for c in self.comments.values() if c["repo"] == repo.full_name and c["issue"] == number]

    # ---- JSON builders (GitHub's examples, our values) ---------------------------------------------
    def _urls(self, obj):
        """Point every GitHub URL in a body at this server."""
        if isinstance(obj, dict):
            return {k: self._urls(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self._urls(v) for v in obj]
        if isinstance(obj, str):
            return obj.replace("https://api.github.com", self.base_url).replace("https://github.com",
                                                                                  self.base_url + "/html")
        return obj

    def _user(self, login: str, type_: str = "User") -> dict:
        user = copy.deepcopy(EXAMPLES["pull-request"]["user"])
        user = json.loads(json.dumps(user).replace("octocat", login))
        user.update(id=abs(hash(login)) % 10_000_000, login=login, type=type_)
        return user

    def _repo_json(self, repo: RepoState) -> dict:
        body = copy.deepcopy(EXAMPLES["full-repository-default-response"])
        body = json.loads(json.dumps(body).replace("octocat/Hello-World", repo.full_name))
        body.update(id=repo.id, name=repo.name, full_name=repo.full_name, default_branch=repo.default_branch,
                    owner=self._user(repo.owner), clone_url=repo.path.as_uri(), private=False,
                    language="Python")  # the documented example lacks it, real responses have it
        body.pop("parent", None)
        body.pop("source", None)
        body.pop("template_repository", None)
        body.pop("organization", None)
        return body

    def _label_json(self, name: str) -> dict:
        body = copy.deepcopy(EXAMPLES["label"])
        body.update(id=abs(hash(name)) % 10_000_000, name=name, description=None, default=False,
                    archived_at=None, archived_by=None,  # newer GitHub schema (githubkit) requires them
                    url=f"https://api.github.com/repos/x/y/labels/{name}")
        return body

    def _pull_json(self, repo: RepoState, pr: PullState) -> dict:
        body = copy.deepcopy(EXAMPLES["pull-request"])
        body = json.loads(json.dumps(body).replace("octocat/Hello-World", repo.full_name)
                          .replace("/pulls/1347", f"/pulls/{pr.number}").replace("/issues/1347", f"/issues/{pr.number}")
                          .replace("/pull/1347", f"/pull/{pr.number}"))
        repo_json = self._repo_json(repo)
        for side, ref in (("head", pr.head_ref), ("base", pr.base_ref)):
            body[side].update(ref=ref, sha=self.sha(repo, ref), label=f"{repo.owner}:{ref}",
                              user=self._user(repo.owner), repo=copy.deepcopy(repo_json))
        body.update(number=pr.number, id=pr.number + 10_000, title=pr.title, user=self._user(pr.author),
                    state=pr.state, merged=pr.merged, merge_commit_sha=pr.merge_commit_sha,
                    labels=[self._label_json(n) for n in pr.labels], mergeable=pr.mergeable, rebaseable=True,
                    mergeable_state="clean" if pr.mergeable else "dirty", requested_teams=[], draft=False,
                    auto_merge=None)
        if pr.updated_at:
            body["updated_at"] = pr.updated_at
        if not pr.merged:
            body.update(merged_at=None, merged_by=None, closed_at=None if pr.state == "open" else body["closed_at"])
        return body

    def _issue_json(self, repo: RepoState, pr: PullState) -> dict:
        body = copy.deepcopy(EXAMPLES["issue"])
        body = json.loads(json.dumps(body).replace("octocat/Hello-World", repo.full_name)
                          .replace("/issues/1347", f"/issues/{pr.number}").replace("/pulls/1347", f"/pulls/{pr.number}"))
        body.update(number=pr.number, title=pr.title, user=self._user(pr.author), state=pr.state,
                    labels=[self._label_json(n) for n in pr.labels],
                    comments=len(self.comments_on(repo, pr.number)))
        return body

    def _comment_json(self, c: dict) -> dict:
        body = copy.deepcopy(EXAMPLES["issue-comment"])
        repo = c["repo"]
        body.update(id=c["id"], body=c["body"], user=self._user(c["login"], c.get("type", "Bot")),
                    created_at=c["created_at"],
                    updated_at=c["updated_at"],
                    url=f"https://api.github.com/repos/{repo}/issues/comments/{c['id']}",
                    html_url=f"https://github.com/{repo}/pull/{c['issue']}#issuecomment-{c['id']}",
                    issue_url=f"https://api.github.com/repos/{repo}/issues/{c['issue']}")
        return body

    def _check_json(self, run: dict) -> dict:
        body = copy.deepcopy(EXAMPLES["check-run"])
        repo = run["repo"]
        body.update({k: v for k, v in run.items() if k in ("id", "name", "head_sha", "status", "conclusion",
                                                           "started_at", "completed_at", "external_id",
                                                           "details_url")})
        out = run.get("output") or {}
        body["output"] = {"title": out.get("title"), "summary": out.get("summary"), "text": out.get("text"),
                          "annotations_count": 0,
                          "annotations_url": f"https://api.github.com/repos/{repo}/check-runs/{run['id']}/annotations"}
        body["url"] = f"https://api.github.com/repos/{repo}/check-runs/{run['id']}"
        body["html_url"] = f"https://github.com/{repo}/runs/{run['id']}"
        body["app"]["id"] = self.app_id
        body["pull_requests"] = []
        return body

    # ---- HTTP plumbing ------------------------------------------------------------------------------
    def _handler_class(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _reset(self) -> None:
                """Drop the connection with a TCP RST: the client sees ECONNRESET, no response."""
                import socket
                import struct
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                self.connection.close()

            def _serve(self, method: str):
                url = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                fault = fake.fault_for(method)
                if fault == "outage":
                    out = b'{"message": "Service Unavailable"}'
                    self.send_response(503)
                    self.send_header("Content-Type", "application/json; charset=utf-8")
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                    return
                if fault == "reset-before":
                    return self._reset()
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                status, response, operation = fake.route(method, url.path, parse_qs(url.query), body,
                                                         self.headers.get("Authorization", ""))
                out = json.dumps(fake._urls(response)).encode() if response is not None else b""
                with fake.lock:
                    fake.requests.append(Recorded(method, url.path, parse_qs(url.query), body, status,
                                                  json.loads(out) if out else None, operation))
                if fault == "reset-after":  # done on the server, the answer lost on the way
                    return self._reset()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def do_GET(self):
                self._serve("GET")

            def do_POST(self):
                self._serve("POST")

            def do_PATCH(self):
                self._serve("PATCH")

            def do_PUT(self):
                self._serve("PUT")

            def do_DELETE(self):
                self._serve("DELETE")

        return Handler

    ROUTES = [
        ("POST", r"/app/installations/(?P<iid>\d+)/access_tokens", "apps/create-installation-access-token"),
        ("GET", r"/app", "apps/get-authenticated"),
        ("GET", r"/repos/(?P<o>[^/]+)/(?P<r>[^/]+)", "repos/get"),
        ("GET", r"/repos/(?P<o>[^/]+)/(?P<r>[^/]+)/pulls/(?P<n>\d+)", "pulls/get"),
        ("GET", r"/repos/(?P<o>[^/]+)/(?P<r>[^/]+)/compare/(?P<base>[^.]+)\.\.\.(?P<head>.+)", "repos/compare-commits"),
        ("PUT", r"/repos/(?P<o>[^/]+)/(?P<r>[^/]+)/pulls/(?P<n>\d+)/merge", "pulls/merge"),
        ("GET", r"/repos/(?P<o>[^/]+)/(?P<r>[^/]+)/issues/(?P<n>\d+)", "issues/get"),
        ("GET", r"/repos/(?P<o>[^/]+)/(?P<r>[^/]+)/issues/(?P<n>\d+)/comments", "issues/list-comments"),
        ("POST", r"/repos/(?P<o>[^/]+)/(?P<r>[^/]+)/issues/(?P<n>\d+)/comments", "issues/create-comment"),
        ("PATCH", r"/repos/(?P<o>[^/]+)/(?P<r>[^/]+)/issues/comments/(?P<cid>\d+)", "issues/update-comment"),
        ("POST", r"/repos/(?P<o>[^/]+)/(?P<r>[^/]+)/issues/(?P<n>\d+)/labels", "issues/add-labels"),
        ("PUT", r"/repos/(?P<o>[^/]+)/(?P<r>[^/]+)/issues/(?P<n>\d+)/labels", "issues/set-labels"),
        ("DELETE", r"/repos/(?P<o>[^/]+)/(?P<r>[^/]+)/issues/(?P<n>\d+)/labels/(?P<name>[^/]+)",
         "issues/remove-label"),
        ("POST", r"/repos/(?P<o>[^/]+)/(?P<r>[^/]+)/check-runs", "checks/create"),
        ("PATCH", r"/repos/(?P<o>[^/]+)/(?P<r>[^/]+)/check-runs/(?P<cid>\d+)", "checks/update"),
        ("GET", r"/repos/(?P<o>[^/]+)/(?P<r>[^/]+)/collaborators/(?P<u>[^/]+)/permission",
         "repos/get-collaborator-permission-level"),
        ("GET", r"/repos/(?P<o>[^/]+)/(?P<r>[^/]+)/commits/(?P<ref>.+)/status", "repos/get-combined-status-for-ref"),
        ("GET", r"/repos/(?P<o>[^/]+)/(?P<r>[^/]+)/commits/(?P<ref>.+)/check-runs", "checks/list-for-ref"),
    ]

    def route(self, method: str, path: str, query: dict, body, auth: str) -> tuple[int, object, str]:
        for m, pattern, op in self.ROUTES:
            match = re.fullmatch(pattern, path)
            if m == method and match:
                with self.lock:
                    if op == "apps/create-installation-access-token" or op == "apps/get-authenticated":
                        error = self._check_jwt(auth)
                    else:
                        error = self._check_token(auth)
                    if error:
                        return 401, {"message": error, "documentation_url": "https://docs.github.com/rest"}, op
                    handler = getattr(self, "op_" + op.replace("/", "_").replace("-", "_"))
                    status, response = handler(query=query, body=body, **{k: unquote(v) for k, v in
                                                                           match.groupdict().items()})
                    return status, response, op
        return 404, {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}, "unknown"

    def op_repos_compare_commits(self, o, r, base, head, query, body):
        """status/ahead_by/behind_by from the real git repository (the rest of the documented body omitted)."""
        repo = self._repo(o, r)
        try:
            behind, ahead = (int(x) for x in git(repo.path, "rev-list", "--left-right", "--count",
                                                 f"{base}...{head}").split())
        except Exception:  # noqa: BLE001 - unknown commit
            return 404, {"message": "Not Found"}
        status = ("identical" if not (ahead or behind) else "ahead" if not behind else "behind" if not ahead
                  else "diverged")
        return 200, {"url": f"{self.base_url}/repos/{repo.full_name}/compare/{base}...{head}", "status": status,
                     "ahead_by": ahead, "behind_by": behind, "total_commits": ahead, "commits": [], "files": []}

    def _check_jwt(self, auth: str) -> str | None:
        if not auth.startswith("Bearer "):
            return "A JSON web token could not be decoded"
        try:
            claims = jwt.decode(auth[7:], self.public_key_pem, algorithms=["RS256"])
        except jwt.PyJWTError as exc:
            return f"A JSON web token could not be decoded: {exc}"
        if str(claims.get("iss")) != str(self.app_id):
            return "'Issuer' claim ('iss') must be the app id"
        return None

    def _check_token(self, auth: str) -> str | None:
        token = auth.split(" ", 1)[1] if " " in auth else ""
        expires = self.tokens.get(token)
        if expires is None:
            return "Bad credentials"
        if expires <= datetime.now(timezone.utc):
            return "Bad credentials (token expired)"
        return None

    def _repo(self, o: str, r: str) -> RepoState:
        return self.repos[f"{o}/{r}".lower()]

    # ---- operations ----------------------------------------------------------------------------------
    def op_apps_create_installation_access_token(self, query, body, iid):
        if int(iid) != self.installation_id:
            return 404, {"message": "Not Found"}
        token = "ghs_" + secrets.token_hex(18)
        expires = datetime.now(timezone.utc) + timedelta(seconds=self.token_ttl_s)
        self.tokens[token] = expires
        out = copy.deepcopy(EXAMPLES["installation-token"])
        out.update(token=token, expires_at=iso(expires), repository_selection="all")
        out.pop("repositories", None)
        return 201, out

    def op_apps_get_authenticated(self, query, body):
        out = copy.deepcopy(EXAMPLES["integration"])
        out.update(id=self.app_id, slug=self.app_slug)
        return 200, out

    def op_repos_get(self, query, body, o, r):
        repo = self._repo(o, r)
        return 200, self._repo_json(repo)

    def op_pulls_get(self, query, body, o, r, n):
        repo = self._repo(o, r)
        pr = repo.pulls.get(int(n))
        return (200, self._pull_json(repo, pr)) if pr else (404, {"message": "Not Found"})

    def op_pulls_merge(self, query, body, o, r, n):
        repo = self._repo(o, r)
        pr = repo.pulls[int(n)]
        if pr.state != "open" or not pr.mergeable:
            return 405, {"message": "Pull Request is not mergeable"}
        head = self.sha(repo, pr.head_ref)
        if body and body.get("sha") and body["sha"] != head:
            return 409, {"message": "Head branch was modified. Review and try the merge again."}
        message = (body or {}).get("commit_title") or f"Merge #{pr.number}"
        git(repo.path, "checkout", "-q", pr.base_ref)
        git(repo.path, "merge", "-q", "--squash", pr.head_ref)
        git(repo.path, "commit", "-q", "-m", message)
        sha = self.sha(repo, pr.base_ref)
        pr.state, pr.merged, pr.merge_commit_sha = "closed", True, sha
        pr.updated_at = iso(datetime.now(timezone.utc))  # GitHub's updated_at moves with the merge
        out = copy.deepcopy(EXAMPLES["pull-request-merge-result-response-if-merge-was-successful"])
        out.update(sha=sha, merged=True, message="Pull Request successfully merged")
        return 200, out

    def op_issues_get(self, query, body, o, r, n):
        repo = self._repo(o, r)
        pr = repo.pulls.get(int(n))
        return (200, self._issue_json(repo, pr)) if pr else (404, {"message": "Not Found"})

    def op_issues_list_comments(self, query, body, o, r, n):
        repo = self._repo(o, r)
        return 200, [self._comment_json(c) for c in self.comments_on(repo, int(n))]

    def op_issues_create_comment(self, query, body, o, r, n):
        return 201, self._comment_json(self.post_comment(self._repo(o, r), int(n), body["body"],
                                                         f"{self.app_slug}[bot]", "Bot"))

    def post_comment(self, repo: RepoState, number: int, body: str, login: str, type_: str = "User") -> dict:
        """A comment on the issue by anyone (the App's own through the API; a test's for everyone else)."""
        with self.lock:
            now = iso(datetime.now(timezone.utc))
            c = {"id": next(self._ids), "repo": repo.full_name, "issue": number, "body": body, "login": login,
                 "type": type_, "created_at": now, "updated_at": now, "edits": 0}
            self.comments[c["id"]] = c
            return c

    def op_issues_update_comment(self, query, body, o, r, cid):
        c = self.comments.get(int(cid))
        if c is None:
            return 404, {"message": "Not Found"}
        c.update(body=body["body"], updated_at=iso(datetime.now(timezone.utc)), edits=c["edits"] + 1)
        return 200, self._comment_json(c)

    def _labels_of(self, o, r, n) -> tuple[RepoState, PullState]:
        repo = self._repo(o, r)
        return repo, repo.pulls[int(n)]

    @staticmethod
    def _label_names(body) -> list[str]:
        items = body.get("labels", []) if isinstance(body, dict) else (body or [])
        return [x["name"] if isinstance(x, dict) else x for x in items]

    def op_issues_add_labels(self, query, body, o, r, n):
        repo, pr = self._labels_of(o, r, n)
        pr.labels += [x for x in self._label_names(body) if x not in pr.labels]
        return 200, [self._label_json(x) for x in pr.labels]

    def op_issues_set_labels(self, query, body, o, r, n):
        repo, pr = self._labels_of(o, r, n)
        pr.labels = list(dict.fromkeys(self._label_names(body)))
        return 200, [self._label_json(x) for x in pr.labels]

    def op_issues_remove_label(self, query, body, o, r, n, name):
        repo, pr = self._labels_of(o, r, n)
        if name not in pr.labels:
            return 404, {"message": "Label does not exist"}
        pr.labels.remove(name)
        return 200, [self._label_json(x) for x in pr.labels]

    def op_checks_create(self, query, body, o, r):
        repo = self._repo(o, r)
        run = {"id": next(self._ids), "repo": repo.full_name, "name": body["name"], "head_sha": body["head_sha"],
               "status": body.get("status", "queued"), "conclusion": body.get("conclusion"),
               "external_id": body.get("external_id", ""), "details_url": body.get("details_url"),
               "output": body.get("output"), "started_at": body.get("started_at"), "completed_at": None,
               "history": [dict(body)]}
        self.check_runs[run["id"]] = run
        return 201, self._check_json(run)

    def op_checks_update(self, query, body, o, r, cid):
        run = self.check_runs.get(int(cid))
        if run is None:
            return 404, {"message": "Not Found"}
        if body.get("conclusion") == "action_required" and not (body.get("details_url") or run.get("details_url")
                                                                  or body.get("actions")):
            return 422, {"message": "details_url or actions required for action_required"}
        for key in ("status", "conclusion", "output", "started_at", "completed_at", "details_url", "actions"):
            if key in body:
                run[key] = body[key]
        run["history"].append(dict(body))
        return 200, self._check_json(run)

    def op_repos_get_collaborator_permission_level(self, query, body, o, r, u):
        repo = self._repo(o, r)
        perm = repo.permissions.get(u.lower())
        if perm is None:
            return 404, {"message": f"{u} is not a user"}
        out = copy.deepcopy(EXAMPLES["repository-collaborator-permission-response-if-user-has-admin-permissions"])
        legacy = {"maintain": "write", "triage": "read"}.get(perm, perm)
        out.update(permission=legacy, role_name=perm, user=self._user(u))
        out["user"]["role_name"] = perm
        return 200, out

    def op_repos_get_combined_status_for_ref(self, query, body, o, r, ref):
        repo = self._repo(o, r)
        sha = self.sha(repo, ref)
        statuses = repo.statuses.get(sha, [])
        example = EXAMPLES["combined-commit-status"]
        out = copy.deepcopy(example)
        items = []
        for i, s in enumerate(statuses):
            item = copy.deepcopy(example["statuses"][0])
            item.update(id=i + 1, state=s["state"], context=s["context"])
            items.append(item)
        state = "pending" if not items or any(s["state"] == "pending" for s in items) else (
            "success" if all(s["state"] == "success" for s in items) else "failure")
        out.update(sha=sha, statuses=items, state=state, total_count=len(items))
        out["repository"] = {k: v for k, v in self._repo_json(repo).items() if k in out["repository"]}
        return 200, out

    def op_checks_list_for_ref(self, query, body, o, r, ref):
        repo = self._repo(o, r)
        sha = self.sha(repo, ref)
        name, status = (query.get("check_name") or [None])[0], (query.get("status") or [None])[0]
        mine = [run for run in self.check_runs.values() if run["repo"] == repo.full_name and run["head_sha"] == sha
                and name in (None, run["name"]) and status in (None, run["status"])]
        if (query.get("filter") or ["latest"])[0] == "latest":  # GitHub's default: the newest run of each name
            newest = {run["name"]: run for run in sorted(mine, key=lambda r: r["id"])}
            mine = [run for run in mine if newest[run["name"]] is run]
        runs = [self._check_json(run) for run in mine]
        for i, other in enumerate(repo.other_checks.get(sha, [])):
            runs.append(self._check_json({"id": 900_000 + i, "repo": repo.full_name, "head_sha": sha,
                                          "external_id": "", "details_url": None, "output": None,
                                          "started_at": None, "completed_at": None, **other}))
        return 200, {"total_count": len(runs), "check_runs": runs}
