"""bench/run.py: how the one table is drawn, how a bench's figures are read, and how the results page's table is
replaced."""

from __future__ import annotations

import pytest

from bench.run import (
    END_MARKER,
    SNIPPET_END,
    SNIPPET_START,
    START_MARKER,
    Outcome,
    Row,
    flatten,
    parse_figures,
    render,
    render_table,
    replace_between_markers,
    results_page,
    worker_rows,
)


def test_a_row_shows_value_baseline_and_their_ratio() -> None:
    table = render_table([Row(measure="claims/s", value=1500.0, baseline=3000.0, baseline_is="pgbench", notes="a|b")])
    header, rule, row = table.splitlines()
    assert header.startswith("| measure | value | baseline")
    assert rule.count("|") == header.count("|")
    assert row == "| claims/s | 1,500 | 3,000 (pgbench) | 0.50 | a\\|b |"


def test_a_failed_bench_is_a_row_and_a_missing_baseline_a_dash() -> None:
    table = render_table(
        [Row(measure="gateway.py", value=None, notes="FAILED: exit 1: boom", failed=True), Row(measure="x", value=2.0)]
    )
    assert "| gateway.py | FAILED | - | - | FAILED: exit 1: boom |" in table
    assert "| x | 2.00 | - | - |  |" in table


def test_render_puts_the_machine_above_the_table() -> None:
    outcome = Outcome(bench="claims", seconds=50.0, busy_percent=88.8, rows=[Row(measure="m", value=1.0)])
    text = render({"CPU": "AMD EPYC", "cores": "2"}, [outcome], quick=True)
    assert text.splitlines()[:2] == ["- CPU: AMD EPYC", "- cores: 2"]
    assert "claims 50 s / 89 %" in text
    assert "--quick" in text
    assert "| m | 1.00 |" in text


def test_the_table_is_replaced_between_the_markers_only() -> None:
    text = f"# Title\n\nbefore\n{START_MARKER}\nold table\n{END_MARKER}\nafter\n"
    once = replace_between_markers(text, "new table\n")
    assert once == f"# Title\n\nbefore\n{START_MARKER}\nnew table\n{END_MARKER}\nafter\n"
    assert replace_between_markers(once, "new table") == once  # idempotent
    with pytest.raises(ValueError):
        replace_between_markers("no markers here", "x")


def test_the_results_page_marks_the_table_as_the_section_the_docs_site_includes() -> None:
    page = results_page("| m | 1.00 |\n")
    assert page.index(SNIPPET_START) < page.index(START_MARKER) < page.index("| m | 1.00 |")
    assert page.index("| m | 1.00 |") < page.index(END_MARKER) < page.index(SNIPPET_END)
    assert replace_between_markers(page, "| n | 2.00 |").count(SNIPPET_START) == 1


def test_figures_are_read_from_json_nested_or_flat() -> None:
    assert parse_figures('log line\n{"a": 1}\n') == {"a": 1}
    assert parse_figures('[\n  {"nodes": 20}\n]') == [{"nodes": 20}]
    flat = flatten([{"nodes": 20, "adoption": {"seconds_to_adopted": 4.0}, "load": [1.0, 2.0], "none": {}}])
    assert flat == {"nodes": 20, "adoption_seconds_to_adopted": 4.0, "load_0": 1.0, "load_1": 2.0, "none": {}}


def test_worker_rows_compare_each_process_count_with_its_pgbench_run() -> None:
    figures = {
        "workers1_items_per_s": 1000.0,
        "workers1_pgbench_items_per_s": 2000.0,
        "workers1_ratio_one_worker": 1.0,
        "workers1_shards": "256",
        "workers2_items_per_s": 1800.0,
        "workers2_pgbench_items_per_s": 2000.0,
        "workers2_ratio_one_worker": 1.8,
        "workers2_shards": "128/128",
    }
    rows = worker_rows(figures)
    assert [r.ratio for r in rows] == [0.5, 0.9]
    assert "1.80 x one worker" in rows[1].notes
