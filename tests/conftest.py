"""Suite-wide test setup.

`TOKENGATE_SHARED` points at the read-only shared/ folder that sits beside the checkout (on a
developer machine and in CI alike); tests read fixtures from there.
"""
import os
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOKENGATE_SHARED", str(REPO.parent / "shared"))

# On the 2-core CI box a second torch thread only spins; one thread is faster and repeatable.
torch.set_num_threads(1)
