"""Stand-ins for what the bot talks to, shared by the tests and scripts/fault_drill.py: our own GitHub
server (github_server), the compose stack run as native processes (native_stack) and a fake evaluation
for GPU workers (fake_evaluation; `tokengate worker --include bot.testing.fake_gpu_tasks`).

Used from a checkout only: they read docker-compose.yml, .env.example and tests/fixtures/github/.
Nothing in the service imports them.
"""
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GITHUB_FIXTURES = REPO / "tests" / "fixtures" / "github"  # GitHub's API subset the test server follows
