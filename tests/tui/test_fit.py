"""Fitting ids, counts and lines to a width: an id keeps its tail, a count is never cut, a line
drops whole parts and says where they are."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.cells import cell_len

from warpdeck.tui.fit import ELLIPSIS, Part, count, count_forms, fit_parts, middle
from warpdeck.tui.widgets.column_title import column_title

ids = st.text(st.characters(codec="utf-8", exclude_categories=("C", "Z", "M")), min_size=1, max_size=40)
widths = st.integers(min_value=-2, max_value=50)


@given(ids, widths)
def test_a_shortened_id_fits_and_keeps_its_tail(key: str, width: int) -> None:
    short = middle(key, width)
    assert cell_len(short) <= max(width, 0)
    if cell_len(key) <= width:
        assert short == key
        return
    assert (ELLIPSIS in short) or width <= 0
    if width > 0:
        head, _, tail = short.partition(ELLIPSIS)
        assert key.startswith(head) and key.endswith(tail)
        assert cell_len(key[-1]) > width - 1 or tail.endswith(key[-1])  # the last character, room permitting


@given(st.text(st.sampled_from("abc-_0123456789"), min_size=1, max_size=30), st.integers(min_value=1, max_value=40))
def test_an_ascii_id_uses_its_whole_width_and_shows_the_ellipsis_only_when_shortened(key: str, width: int) -> None:
    short = middle(key, width)
    assert (ELLIPSIS in short) == (len(key) > width)
    assert len(short) == min(len(key), width)


@pytest.mark.parametrize(("width", "expected"), [
    (12, "syn-00046720"), (11, "syn-…046720"), (10, "syn-…46720"), (9, "syn-…6720"), (8, "…0046720"),
    (2, "…0"), (1, "…"), (0, ""),
])
def test_an_id_keeps_a_short_head_and_as_much_tail_as_fits(width: int, expected: str) -> None:
    assert middle("syn-00046720", width) == expected


def test_wide_characters_are_measured_in_cells() -> None:
    short = middle("日本語のタスク-00046720", 12)
    assert cell_len(short) <= 12
    assert short.endswith("046720") and short.startswith("日本")


@given(st.integers(min_value=0, max_value=10**15), st.integers(min_value=1, max_value=20))
def test_a_count_is_exact_when_it_fits_and_never_overstated_when_abbreviated(n: int, width: int) -> None:
    text = count(n, width)
    assert text in count_forms(n)
    if len(f"{n:,}") <= width:
        assert text == f"{n:,}"
        return
    assert cell_len(text) <= width or text == count_forms(n)[-1]
    if text != f"{n:,}":
        number, unit = float(text[:-1].replace(",", "")), text[-1]
        assert number * 1000 ** ("kMGTP".index(unit) + 1) <= n  # rounded down, never up


@pytest.mark.parametrize(("n", "forms"), [
    (999, ("999",)),
    (148_990, ("148,990", "148.99k", "148.9k", "148k")),
    (1_234_567, ("1,234,567", "1.23M", "1.2M", "1M")),
    (999_999, ("999,999", "999.99k", "999.9k", "999k")),
])
def test_count_forms(n: int, forms: tuple[str, ...]) -> None:
    assert count_forms(n) == forms


def test_a_line_keeps_what_fits_by_rank_in_line_order_and_says_where_the_rest_is() -> None:
    parts = [Part("rate", 10, 0), Part("overlap", 20, 3, "3 timeline"), Part("p50", 8, 1),
             Part("amdahl", 25, 4, "3 timeline")]
    assert fit_parts(parts, 66, gap=1) == (parts, "")
    kept, note = fit_parts(parts, 40, gap=1)
    assert [p.item for p in kept] == ["rate", "p50"]
    assert note == "… 3 timeline"
    assert sum(p.cells for p in kept) + len(kept) - 1 + 1 + cell_len(note) <= 40
    assert fit_parts([Part("a", 5, 0), Part("b", 5, 1)], 8, gap=1) == ([Part("a", 5, 0)], "…")


@pytest.mark.parametrize(("width", "expected"), [
    (40, "done 148,990 ✗3,512 ⊘20"),
    (22, "done 148.9k ✗3.5k ⊘20"),
    (17, "done 148k ✗3k ⊘20"),
    (16, "done 148k ✗3k"),
    (12, "done 148,990"),
    (11, "done 148.9k"),
    (8, "do… 148k"),
    (7, "d… 148k"),
    (3, "148k"),  # wider than 3, but a count is never cut
])
def test_a_column_title_abbreviates_then_drops_marks_then_shortens_its_name(width: int, expected: str) -> None:
    assert column_title("done", 148_990, 148_990, 3_512, 20, width) == expected


@given(st.integers(0, 10**9), st.integers(0, 10**9), st.integers(0, 10**6), st.integers(0, 10**6),
       st.integers(4, 60))
def test_a_column_title_never_cuts_its_count(shown: int, total: int, failed: int, cancelled: int, width: int) -> None:
    title = column_title("compute", shown, total, failed, cancelled, width)
    own = title.split(" ")[1] if " " in title else title
    assert own.split("/")[0] in count_forms(shown)
    if shown != total:
        assert own.split("/")[1] in count_forms(total)
