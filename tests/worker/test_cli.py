import argparse
import json

import pytest
from rich.console import Console

from worker import cli
from worker.calibration.aa_store import AAStore

from tests.worker.helpers import GOOD, fake_model, make_profile, make_repo, make_settings


@pytest.mark.sandbox
def test_eval_command_writes_comment_and_receipt(tmp_path, cache):
    repo = make_repo(tmp_path, head="slow_decode")
    profile = make_profile(fake_model(tmp_path / "m.gguf"), pairs=3, inner=2, prompts_per_seed=1)
    profile = profile.model_copy(update={"models": [profile.models[0].model_copy(
        update={"decode_contexts": [32], "prefill_contexts": [64]})]})
    args = argparse.Namespace(repo=str(repo), base="main", head="pr", profile="test", models=None, device=None,
                              out=str(tmp_path / "out"), retries=0)
    console = Console(record=True, width=160)
    rc = cli.eval_command(args, console=console, settings=make_settings(profile), trusted_root=GOOD,
                          store=AAStore(tmp_path / "aa.sqlite"))
    assert rc == 1  # REJECT
    text = console.export_text()
    assert "REJECT" in text and "decode@32" in text
    md = (tmp_path / "out" / "comment.md").read_text()
    assert "**REJECT**" in md and "| fake | decode@32" in md and "REGRESSION" in md
    receipt = json.loads((tmp_path / "out" / "receipt.json").read_text())
    rc_ = receipt["receipt"]
    assert rc_["revisions"]["head"]["sha"] == receipt["head_sha"] and len(receipt["head_sha"]) == 40
    assert rc_["models"]["fake"]["gguf_sha256"] and rc_["isolation"]["method"]
    assert rc_["processes"]["head"]["cpu_user_s"] > 0
    assert rc_["resources"]["window"]["energy_j"]["value"] is None  # CPU: null with a reason
    assert rc_["resources"]["window"]["energy_j"]["reason"]


def test_bad_profile_is_a_clear_error(tmp_path):
    args = argparse.Namespace(repo=".", base="a", head="b", profile="nope", models=None, device=None, out=None,
                              retries=None)
    import pytest

    with pytest.raises(ValueError, match="unknown profile 'nope'"):
        cli.eval_command(args, console=Console(file=open("/dev/null", "w")))
