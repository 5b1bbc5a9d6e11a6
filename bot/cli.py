"""`tokengate` command line: one small function per subcommand, dispatched by argparse.

Service commands live here (serve, worker, db, round); evaluation commands (eval, demo,
calibrate) are implemented in worker/ and imported only when used.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys


LOOPBACK = {"127.0.0.1", "::1", "localhost"}


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from bot import logs
    from bot.settings import get_settings
    from bot.web.webhook import create_app
    settings = get_settings()
    if settings.placeholder_secret() and args.host not in LOOPBACK:
        raise SystemExit(f"tokengate serve: TOKENGATE_WEBHOOK_SECRET is a placeholder ({settings.webhook_secret!r}); "
                         f"anyone could sign webhooks. Set a real secret, or bind to 127.0.0.1 for development.")
    settings.require_github()
    logs.configure(args.log_level)
    workers = args.workers or settings.web_workers
    # Several processes need the app by name: each worker process imports it and sets up its own logs.
    os.environ[SERVE_LOG_LEVEL] = args.log_level
    app = "bot.cli:web_app" if workers > 1 else ready(create_app())
    uvicorn.run(app, factory=workers > 1, host=args.host, port=args.port, workers=workers,
                log_level=args.log_level, access_log=True, log_config=None)
    return 0


SERVE_LOG_LEVEL = "TOKENGATE_SERVE_LOG_LEVEL"  # parent `serve` → its uvicorn worker processes


def web_app():
    """The web app of one of `serve --workers N`'s processes."""
    from bot import logs
    from bot.web.webhook import create_app
    logs.configure(os.environ.get(SERVE_LOG_LEVEL, "info"))
    return ready(create_app())


def ready(app):
    """Connections open before the first request (bot.web.webhook.warm_up); then everything imported so far
    (~200k objects: SQLAlchemy, Celery, SciPy via the dashboard) is moved out of the collector's reach: a
    full collection over it stalls every request in flight for ~0.25 s."""
    import gc

    from bot.web.webhook import warm_up
    warm_up()
    gc.collect()
    gc.freeze()
    return app


def cmd_worker(args: argparse.Namespace) -> int:
    from bot.queue.app import celery_app
    from bot.settings import get_settings
    from worker.queue.app import EVALUATE_TASK
    queues = [q.strip() for q in args.queues.split(",") if q.strip()]
    unknown = set(queues) - {"gpu", "publish"}
    if unknown:
        raise SystemExit(f"unknown queue(s) {sorted(unknown)}: choose gpu and/or publish")
    from bot import logs
    logs.configure(args.log_level)
    app = celery_app()
    # --include'd modules first: one that registers the evaluation task stands in for the pipeline's
    # (tests run a fake `tokengate.evaluate` this way), so worker.queue.tasks is then not imported at all.
    for module in args.include or []:
        importlib.import_module(module)
    if "publish" in queues:
        get_settings().require_github()  # only the publish side holds credentials
        importlib.import_module("bot.queue.tasks")
        if get_settings().metrics_port:  # this worker's counters (GitHub API errors, rate limit)
            from prometheus_client import start_http_server

            from bot.metrics import REGISTRY
            start_http_server(get_settings().metrics_port, registry=REGISTRY)
    if "gpu" in queues and EVALUATE_TASK not in app.tasks:
        _import_optional("worker.queue.tasks")
    argv = ["worker", "-Q", ",".join(queues), "-P", args.pool, "-c", str(args.concurrency),
            "--loglevel", args.log_level.upper(), "-n", args.name]
    if "publish" not in queues:
        # A GPU worker's broker user reaches only its queue and results, and reads the routing tables
        # (bot/queue/acl.py): no declarations, no remote control, no gossip or mingle with the other workers.
        from worker.queue.app import gpu_side
        gpu_side(app)
        argv += ["--without-gossip", "--without-mingle"]
    else:
        from worker.queue.app import declare_queues
        try:
            declare_queues(app)  # the GPU workers route through these tables but may not write them
        except Exception as exc:  # noqa: BLE001  broker down at start: the consumer declares its own on connect
            print(f"warning: could not declare the queues' routing tables yet ({exc})", file=sys.stderr)
    if args.beat:
        if "publish" not in queues:
            raise SystemExit("--beat belongs on the publish worker (it closes rounds and runs the watchdog)")
        from bot.queue.tasks import schedule_periodic
        schedule_periodic(app)
        argv += ["-B", "-s", args.beat_schedule]
    app.worker_main(argv)
    return 0


def _import_optional(module: str) -> None:
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        print(f"tokengate worker: {module} is not installed; only --include'd tasks will run", file=sys.stderr)


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from bot.db import migrate
    from bot.settings import get_settings
    migrate.upgrade(args.url or get_settings().database_url, args.revision)
    return 0


def cmd_db_downgrade(args: argparse.Namespace) -> int:
    from bot.db import migrate
    from bot.settings import get_settings
    migrate.downgrade(args.url or get_settings().database_url, args.revision)
    return 0


def cmd_deliveries_list(args: argparse.Namespace) -> int:
    """Deliveries not processed yet (waiting or given up on), oldest first; --all includes processed ones."""
    from sqlalchemy import select

    from bot.db.engine import session_scope
    from bot.db.models import Delivery
    with session_scope() as session:
        q = select(Delivery).order_by(Delivery.received_at).limit(args.limit)
        if not args.all:
            q = q.where(Delivery.processed_at.is_(None))
        rows = list(session.scalars(q))
    for d in rows:
        status = "processed" if d.processed_at else "failed" if d.failed_at else "waiting"
        print(f"{d.id}\t{d.event}.{d.action or '-'}\t{status}\tattempts={d.attempts}\t"
              f"received={d.received_at:%Y-%m-%dT%H:%M:%SZ}\t{(d.last_error or d.outcome or '')[:120]}")
    print(f"{len(rows)} deliver{'y' if len(rows) == 1 else 'ies'}", file=sys.stderr)
    return 0


def cmd_deliveries_requeue(args: argparse.Namespace) -> int:
    """Send unprocessed deliveries (by id, or all; --failed: only those given up on) to the publish queue."""
    from bot.db.engine import session_scope
    from bot.queue import outbox
    if not args.ids and not args.all and not args.failed:
        raise SystemExit("tokengate deliveries requeue: name delivery ids, or --failed, or --all")
    with session_scope() as session:
        sent = outbox.requeue(session, args.ids or None, failed_only=args.failed)
    for delivery_id in sent:
        print(delivery_id)
    print(f"{len(sent)} requeued", file=sys.stderr)
    return 0


def cmd_round_close(args: argparse.Namespace) -> int:
    from bot.rounds import close_round_cli
    return close_round_cli(args.repo, dry_run=args.dry_run)


# Subcommands implemented by the evaluation pipeline (worker/), imported only when used; their
# arguments are passed through untouched (they own their own argparse).
DELEGATED = {
    "eval": ("worker.cli", "eval_main", "evaluate a head against a base locally"),
    "demo": ("worker.cli", "demo_main", "evaluate a throwaway PR branch with embedded defaults"),
    "calibrate": ("worker.cli", "calibrate_main", "measure the noise floor of this machine"),
}


def run_delegated(name: str, argv: list[str]) -> int:
    module, func, _ = DELEGATED[name]
    return int(getattr(importlib.import_module(module), func)(argv) or 0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokengate", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the webhook web app (uvicorn)")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--log-level", default="info")
    p.add_argument("--workers", type=int, help="uvicorn processes (default: TOKENGATE_WEB_WORKERS, 1)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("worker", help="run a Celery worker for the gpu and/or publish queue")
    p.add_argument("--queues", "-Q", required=True, help="gpu, publish or gpu,publish")
    p.add_argument("--pool", "-P", default="solo", help="solo (one evaluation per GPU), threads or prefork")
    p.add_argument("--concurrency", "-c", type=int, default=1)
    p.add_argument("--name", "-n", default="tokengate@%h")
    p.add_argument("--include", "-I", action="append", help="extra task module to import")
    p.add_argument("--beat", action="store_true", help="also run the scheduler (run it on ONE publish worker)")
    p.add_argument("--beat-schedule", default="/tmp/tokengate-beat-schedule")
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=cmd_worker)

    db = sub.add_parser("db", help="database migrations").add_subparsers(dest="db_command", required=True)
    p = db.add_parser("upgrade", help="migrate the database to a revision (default: head)")
    p.add_argument("revision", nargs="?", default="head")
    p.add_argument("--url", help="database URL (default: TOKENGATE_DATABASE_URL)")
    p.set_defaults(func=cmd_db_upgrade)
    p = db.add_parser("downgrade", help="migrate the database down to a revision (default: base)")
    p.add_argument("revision", nargs="?", default="base")
    p.add_argument("--url")
    p.set_defaults(func=cmd_db_downgrade)

    dl = sub.add_parser("deliveries", help="webhook deliveries (the outbox)").add_subparsers(
        dest="deliveries_command", required=True)
    p = dl.add_parser("list", help="deliveries not processed yet (waiting or given up on)")
    p.add_argument("--all", action="store_true", help="processed ones too")
    p.add_argument("--limit", type=int, default=200)
    p.set_defaults(func=cmd_deliveries_list)
    p = dl.add_parser("requeue", help="send unprocessed deliveries to the publish queue again")
    p.add_argument("ids", nargs="*")
    p.add_argument("--failed", action="store_true", help="those given up on after their retries")
    p.add_argument("--all", action="store_true", help="every unprocessed delivery")
    p.set_defaults(func=cmd_deliveries_requeue)

    rounds = sub.add_parser("round", help="merge-first rounds").add_subparsers(dest="round_command", required=True)
    p = rounds.add_parser("close", help="close the open round of a repository and merge its winner")
    p.add_argument("repo", help="owner/name")
    p.add_argument("--dry-run", action="store_true", help="print what would happen, change nothing")
    p.set_defaults(func=cmd_round_close)

    for name, (_module, _func, help_) in DELEGATED.items():
        sub.add_parser(name, help=help_, add_help=False)  # listed in --help; dispatched before parsing
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in DELEGATED:
        return run_delegated(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
