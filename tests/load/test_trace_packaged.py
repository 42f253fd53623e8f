"""The packaged Azure traces and what bad trace files get (one clear error each)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from click.testing import CliRunner

from aivitals.errors import ConfigError, ParseError
from aivitals.load import TRACES, dataset_dir, load_trace
from aivitals.load._cli import load as load_cmd

GOOD = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:00:00.5000000,10,2\n2023-11-16 18:00:01.0000000,20,3\n"
)


def test_packaged_traces_ship_with_their_licence() -> None:
    folder = dataset_dir()
    for name in TRACES.values():
        assert folder.joinpath(name).is_file()
    # CC-BY 4.0 wants the licence (or its link) beside the material.
    assert "Attribution 4.0 International" in folder.joinpath("LICENSE").read_text("utf-8-sig")
    notice = folder.joinpath("NOTICE").read_text("utf-8")
    assert "Splitwise" in notice and "creativecommons.org/licenses/by/4.0" in notice


def test_packaged_conv_trace_is_whole() -> None:
    reqs = load_trace("azure-conv", max_prompt_tokens=None, max_output_tokens=None)
    # Data rows of AzureLLMInferenceTrace_conv.csv (its last line has no newline).
    assert len(reqs) == 19366
    assert (reqs[0].prompt_tokens, reqs[0].max_tokens) == (374, 44)
    assert 3400 < reqs[-1].at < 3600


def test_a_gzip_compressed_user_file_reads_like_a_plain_one(tmp_path: Path) -> None:
    plain = tmp_path / "t.csv"
    plain.write_text(GOOD)
    packed = tmp_path / "t.csv.gz"
    packed.write_bytes(gzip.compress(GOOD.encode()))
    assert load_trace(str(packed)) == load_trace(str(plain))


def test_corrupt_gzip_is_a_parse_error(tmp_path: Path) -> None:
    data = gzip.compress(GOOD.encode() * 50)
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(data[: len(data) // 2])  # truncated download
    with pytest.raises(ParseError, match=r"cut\.csv\.gz: corrupt gzip"):
        load_trace(str(cut))
    garbage = tmp_path / "garbage.csv.gz"
    garbage.write_bytes(b"\x1f\x8b" + b"\x00not gzip at all" * 4)
    with pytest.raises(ParseError, match="corrupt gzip"):
        load_trace(str(garbage))


def test_other_columns_are_named_in_the_error(tmp_path: Path) -> None:
    other = tmp_path / "other.csv"
    other.write_text("time,prompt,output\n2023-11-16 18:00:00,1,2\n")
    with pytest.raises(ParseError) as info:
        load_trace(str(other))
    msg = str(info.value)
    assert "other.csv" in msg and "time,prompt,output" in msg
    assert "TIMESTAMP,ContextTokens,GeneratedTokens" in msg
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\x00\x81" * 10)
    with pytest.raises(ParseError, match="not UTF-8"):
        load_trace(str(binary))


def test_unknown_trace_name_or_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="azure-code, azure-conv"):
        load_trace("azure-chat")
    with pytest.raises(ConfigError, match="neither a file"):
        load_trace(str(tmp_path / "gone.csv"))


def test_cli_dry_run_reads_the_trace_and_sends_nothing() -> None:
    # No URL at all: nothing could be sent.
    res = CliRunner().invoke(load_cmd, ["--trace", "azure-code", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "trace azure-code: 8819 requests" in res.output and "nothing sent" in res.output
    assert "prompt tokens: mean" in res.output


def test_cli_dry_run_bad_input(tmp_path: Path) -> None:
    res = CliRunner().invoke(load_cmd, ["--dry-run"])
    assert res.exit_code == 2 and "--dry-run needs --trace" in res.output
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    res = CliRunner().invoke(load_cmd, ["--trace", str(other), "--dry-run"])
    assert isinstance(res.exception, ParseError)
    res = CliRunner().invoke(load_cmd, ["--rate", "1"])
    assert res.exit_code == 2 and "Missing argument 'URL'" in res.output


def test_cli_bad_trace_is_one_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from aivitals.cli import main

    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(gzip.compress(GOOD.encode() * 50)[:40])
    for trace, kind in ((str(cut), "ParseError"), ("azure-chat", "ConfigError")):
        with pytest.raises(SystemExit) as info:
            main(["load", "--trace", trace, "--dry-run"])
        assert info.value.code == 1
        err = capsys.readouterr().err
        assert err.startswith(f"{kind}: ") and err.count("\n") == 1, err
