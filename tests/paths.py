"""Where the test data lives: inside the repository (a fresh clone has nothing beside it).

`tests/fixtures/README.md` says where each file came from."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
TINY = FIXTURES / "qwen35-tiny"  # the upstream-made 4-layer model, its prompt and HF fp32 logits
GITHUB = FIXTURES / "github"  # GitHub's example payloads and API/schema subsets
ANCHOR = REPO / "bench" / "anchors" / "llamacpp-h200-anchor.json"
