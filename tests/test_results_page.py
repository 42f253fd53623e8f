"""docs/results.md is generated from benchmarks/results/*.json and never goes stale."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests._paths import REPO, load_script

page = load_script("benchmarks/results_page.py", "results_page")


def test_docs_results_md_is_what_the_results_give() -> None:
    assert (REPO / "docs" / "results.md").read_text(encoding="utf-8") == page.render(), (
        "docs/results.md is stale: run .venv/bin/python benchmarks/results_page.py"
    )


def test_every_results_file_has_its_section_with_its_result_figures() -> None:
    text = page.render()
    for path in sorted((REPO / "benchmarks" / "results").glob("*.json")):
        assert f"\n## {path.stem}\n" in text, path.name
    # the RESULT line of a benchmark that keeps it whole, figure by figure
    sweep = json.loads((REPO / "benchmarks" / "results" / "detection_sweep.json").read_text())
    severe = dict(p.split("=", 1) for p in sweep["result"].split()[1:])["caught_severe"]
    assert f"| `caught_severe` | {severe} |" in text
    # runs/ holds reports, not benchmark results
    assert "validate-full-run1" not in text


def _results(tmp_path: Path, **files: str) -> Path:
    results = tmp_path / "results"
    results.mkdir()
    shutil.copy(REPO / "benchmarks" / "results" / "rules_eval.json", results)
    for name, text in files.items():
        (results / f"{name}.json").write_text(text, encoding="utf-8")
    return results


def test_a_malformed_results_file_is_named_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = _results(tmp_path, broken='{"rps": 1.0,\n  "p50_ms": }\n')
    with pytest.raises(page.ResultsError, match=r"broken\.json: not valid JSON \(line 2") as e:
        page.render(results)
    assert "rules_eval" not in str(e.value)  # only the broken file is blamed

    out = tmp_path / "results.md"
    out.write_text("the page as it was\n", encoding="utf-8")
    assert page.main(["--results", str(results), "--out", str(out)]) == 1
    assert out.read_text(encoding="utf-8") == "the page as it was\n"  # nothing lost
    err = capsys.readouterr().err
    assert err.startswith("ResultsError: ") and "broken.json" in err and "nothing written" in err

    (results / "broken.json").unlink()  # the rest renders once the file is fixed
    assert page.main(["--results", str(results), "--out", str(out)]) == 0
    assert "\n## rules_eval\n" in out.read_text(encoding="utf-8")


def test_every_broken_file_is_named_at_once(tmp_path: Path) -> None:
    results = _results(tmp_path, a="[1, 2]", b="", tsdb='{"query_ms": 1.0}')
    with pytest.raises(page.ResultsError) as e:
        page.render(results)
    message = str(e.value)
    assert "a.json: a JSON object was expected, not list" in message
    assert "b.json: not valid JSON" in message
    # a known benchmark without a figure its RESULT line names
    assert "tsdb.json: no ingest_10k_ms, bytes_per_sample, query_ratio_vs_prometheus" in message


def test_the_code_version_and_date_are_shown_when_recorded(tmp_path: Path) -> None:
    recorded = {
        "result": {"rps": 12.5},
        "git_commit": "0123456789abcdef0123456789abcdef01234567",
        "date": "a day",
    }
    results = _results(tmp_path, mine=json.dumps(recorded), stamped='{"rps": 2, "timestamp": 0}')
    text = page.render(results)
    assert "code version: 0123456789ab; date: a day." in text
    assert "| `rps` | 12.5 |" in text
    assert "date: 1970-01-01 00:00 UTC." in text  # a Unix time
    rules = text.split("\n## rules_eval\n", 1)[1]
    assert "code version: not recorded; date: not recorded." in rules


def test_check_says_whether_the_page_is_stale(tmp_path: Path) -> None:
    results = _results(tmp_path)
    out = tmp_path / "results.md"
    assert page.main(["--results", str(results), "--out", str(out), "--check"]) == 1
    assert not out.exists()
    assert page.main(["--results", str(results), "--out", str(out)]) == 0
    assert page.main(["--results", str(results), "--out", str(out), "--check"]) == 0
