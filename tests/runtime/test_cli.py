"""`tokengate-runtime` synth / info / generate on the tiny shape, and its error messages."""
import pytest

from runtime.cli import main


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("cli") / "tiny.gguf"
    assert main(["synth", "--shape", "tiny", "--quant", "f32", "--seed", "3", "-o", str(p), "--quiet"]) == 0
    return p


def test_synth_prints_size_and_sha(tiny_file, capsys):
    assert tiny_file.exists()


def test_info(tiny_file, capsys):
    assert main(["info", str(tiny_file)]) == 0
    out = capsys.readouterr().out
    assert "sha256" in out and "8 (2 attention, 6 DeltaNet)" in out and "F32" in out


def test_generate_greedy_tokens(tiny_file, capsys):
    assert main(["generate", str(tiny_file), "--random-prompt", "16", "--tokens", "5"]) == 0
    toks = capsys.readouterr().out.split()
    assert len(toks) == 5 and all(0 <= int(t) < 4096 for t in toks)
    assert main(["generate", str(tiny_file), "--prompt-ids", "1,2,3", "--tokens", "3"]) == 0


def test_clear_errors(tmp_path, capsys):
    assert main(["synth", "--shape", "tiny", "--quant", "f32", "-o", str(tmp_path / "no/such/dir/x.gguf")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["info", str(tmp_path / "missing.gguf")]) == 2
    assert "no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["synth", "--shape", "70b", "--quant", "f32", "-o", "x.gguf"])


def test_synth_workers_flag_changes_no_byte(tmp_path, capsys):
    shas = []
    for n in ("1", "3"):
        assert main(["synth", "--shape", "tiny", "--quant", "q8_0", "-o", str(tmp_path / f"{n}.gguf"),
                     "--workers", n, "--max-inflight-gb", "0.01", "--quiet"]) == 0
        shas.append(capsys.readouterr().out.split("sha256")[1].strip())
    assert shas[0] == shas[1]
    assert main(["synth", "--shape", "tiny", "--quant", "f32", "-o", str(tmp_path / "x.gguf"), "--workers", "0"]) == 2
    assert "--workers" in capsys.readouterr().err
