"""Main's history: measurements after each merge, change points, bisection (issue 16).

`on_main_merged` is the hook the pull_request handler calls when a PR was merged; importing this
package registers the publish tasks that receive the measurements.
"""
from bot.history import tasks as _tasks  # noqa: F401  (registers tokengate.history_result/_failed)
from bot.history.measure import on_main_merged

__all__ = ["on_main_merged"]
