"""Built-in themes define every domain colour; user theme files load, inherit, and fail precisely."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
from textual.app import App
from textual.color import Color, rgb_to_lab

from warpdeck.themes import (
    BUILTIN_THEMES,
    DEFAULT_THEME,
    DOMAIN_VARIABLES,
    ThemeFileError,
    all_themes,
    load_theme_file,
    load_user_themes,
    user_theme_dir,
)
from warpdeck.themes.builtin import PHASE_VARIABLES

THEMES = sorted(BUILTIN_THEMES)
# CIE76 distance below which two colours read as "the same colour" next to each other on a bar.
MIN_PHASE_DISTANCE = 20.0


def _write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def _error_for(path: Path) -> ThemeFileError:
    with pytest.raises(ThemeFileError) as caught:
        load_theme_file(path)
    return caught.value


# --- built-ins ---------------------------------------------------------------------------------


def test_default_theme_is_builtin() -> None:
    assert DEFAULT_THEME in BUILTIN_THEMES


@pytest.mark.parametrize("name", THEMES)
def test_builtin_defines_every_domain_variable(name: str) -> None:
    assert set(DOMAIN_VARIABLES) <= set(BUILTIN_THEMES[name].variables)


@pytest.mark.parametrize("name", THEMES)
def test_builtin_colours_parse(name: str) -> None:
    theme = BUILTIN_THEMES[name]
    for variable in DOMAIN_VARIABLES:
        Color.parse(theme.variables[variable])
    theme.to_color_system().generate()  # Textual derives its shades without complaint


@pytest.mark.parametrize("name", THEMES)
def test_phase_colours_are_distinct(name: str) -> None:
    colours = [Color.parse(BUILTIN_THEMES[name].variables[v]) for v in PHASE_VARIABLES]
    assert len(set(colours)) == len(colours)


@pytest.mark.parametrize("name", [n for n in THEMES if not BUILTIN_THEMES[n].ansi])
def test_phase_colours_are_far_apart(name: str) -> None:
    # The ANSI theme is left out: its real shades are the terminal's, not Textual's defaults.
    labs = {v: rgb_to_lab(Color.parse(BUILTIN_THEMES[name].variables[v])) for v in PHASE_VARIABLES}
    for a, b in itertools.combinations(PHASE_VARIABLES, 2):
        assert math.dist(labs[a], labs[b]) >= MIN_PHASE_DISTANCE, (a, b)


def test_ansi_theme_follows_the_terminal() -> None:
    theme = BUILTIN_THEMES["warpdeck-ansi"]
    assert theme.ansi is True
    assert all(theme.variables[v].startswith("ansi_") for v in DOMAIN_VARIABLES)


def test_high_contrast_is_black_with_aa_contrast() -> None:
    theme = BUILTIN_THEMES["warpdeck-high-contrast"]
    assert theme.background == "#000000"

    def luminance(colour: Color) -> float:
        def channel(value: int) -> float:
            v = value / 255
            return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4

        r, g, b = colour.rgb
        return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)

    for variable in DOMAIN_VARIABLES:
        ratio = (luminance(Color.parse(theme.variables[variable])) + 0.05) / 0.05
        assert ratio >= 4.5, variable


async def test_every_builtin_works_in_an_app() -> None:
    app = App[None]()
    for theme in BUILTIN_THEMES.values():
        app.register_theme(theme)
    seen: dict[str, str] = {}
    async with app.run_test():
        for name in THEMES:
            app.theme = name
            seen[name] = app.get_css_variables()["wd-compute"]
    assert seen == {name: BUILTIN_THEMES[name].variables["wd-compute"] for name in THEMES}


# --- user files --------------------------------------------------------------------------------

NORDISH = """\
name = "nordish"
dark = true
[colors]
primary = "#88c0d0"
background = "#2e3440"
[variables]
wd-compute = "#a3be8c"
"""


def test_user_file_round_trip(tmp_path: Path) -> None:
    theme = load_theme_file(_write(tmp_path, "nordish.toml", NORDISH))
    assert theme.name == "nordish"
    assert theme.dark is True
    assert theme.primary == "#88c0d0"
    assert theme.background == "#2e3440"
    assert theme.variables["wd-compute"] == "#a3be8c"


def test_user_file_without_base_still_defines_every_domain_variable(tmp_path: Path) -> None:
    theme = load_theme_file(_write(tmp_path, "nordish.toml", NORDISH))
    assert set(DOMAIN_VARIABLES) <= set(theme.variables)
    assert theme.variables["wd-fill"] == BUILTIN_THEMES["warpdeck-dark"].variables["wd-fill"]


def test_user_file_inherits_from_base(tmp_path: Path) -> None:
    text = 'name = "mine"\nbase = "warpdeck-light"\n[colors]\naccent = "#ff0000"\n[variables]\nwd-sink = "#123456"\n'
    theme = load_theme_file(_write(tmp_path, "mine.toml", text))
    base = BUILTIN_THEMES["warpdeck-light"]
    assert theme.accent == "#ff0000"
    assert theme.primary == base.primary
    assert theme.background == base.background
    assert theme.dark is False
    assert theme.variables["wd-sink"] == "#123456"
    assert theme.variables["wd-fill"] == base.variables["wd-fill"]
    assert base.variables["wd-sink"] != "#123456"  # the built-in itself is untouched


def test_user_file_inherits_ansi_from_base(tmp_path: Path) -> None:
    theme = load_theme_file(_write(tmp_path, "t.toml", 'name = "t"\nbase = "warpdeck-ansi"\n'))
    assert theme.ansi is True


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ('name = "x"\nbase = \n', "(file)", "not valid TOML"),
        ('name = "x"\nbase = "warpdeck-dark"\nshade = 3\n', "shade", "unknown field"),
        ('name = "x"\nbase = "warpdeck-dark"\n[colors]\nmauve = "#fff"\n', "colors.mauve", "unknown field"),
        ('name = "x"\nbase = "warpdeck-dark"\n[colors]\nprimary = "blurple"\n', "colors.primary", "'blurple'"),
        ('name = "x"\nbase = "warpdeck-dark"\n[variables]\nwd-compute = "nope"\n', "variables.wd-compute", "nope"),
        ('name = "x"\nbase = "warpdeck-dark"\n[variables]\nwd-gpu = "#fff"\n', "variables.wd-gpu", "unknown"),
        ('name = "x"\nbase = "solarized"\n', "base", "solarized"),
        ('name = "warpdeck-dark"\nbase = "warpdeck-dark"\n', "name", "built-in"),
        ('name = "nord"\nbase = "warpdeck-dark"\n', "name", "built-in"),
        ('base = "warpdeck-dark"\n', "name", "required"),
        ('name = "x"\n', "colors.primary", "required"),
    ],
    ids=[
        "toml-syntax",
        "unknown-field",
        "unknown-colour-field",
        "bad-colour",
        "bad-variable-colour",
        "unknown-variable",
        "unknown-base",
        "clash-warpdeck",
        "clash-textual",
        "missing-name",
        "no-base-no-primary",
    ],
)
def test_bad_file_names_file_and_field(tmp_path: Path, text: str, field: str, words: str) -> None:
    path = _write(tmp_path, "bad.toml", text)
    error = _error_for(path)
    assert error.path == path
    fields = [f for f, _ in error.issues]
    assert field in fields
    message = dict(error.issues)[field]
    assert words in message
    assert str(path) in str(error)
    assert f"{field}: {message}" in str(error)


def test_bad_colour_message_is_exact(tmp_path: Path) -> None:
    text = 'name = "x"\nbase = "warpdeck-dark"\n[colors]\nprimary = "blurple"\n'
    error = _error_for(_write(tmp_path, "bad.toml", text))
    assert error.issues == [("colors.primary", "not a colour: 'blurple'")]


def test_every_bad_field_is_reported(tmp_path: Path) -> None:
    text = 'name = "x"\nbase = "nope"\nshade = 1\n[colors]\nprimary = "blurple"\n'
    error = _error_for(_write(tmp_path, "bad.toml", text))
    assert {f for f, _ in error.issues} == {"base", "shade", "colors.primary"}


def test_one_bad_file_does_not_hide_the_good_ones(tmp_path: Path) -> None:
    _write(tmp_path, "a.toml", 'name = "alpha"\nbase = "warpdeck-dark"\n')
    bad = _write(tmp_path, "b.toml", 'name = "beta"\n[colors]\nprimary = "blurple"\n')
    _write(tmp_path, "c.toml", NORDISH)
    _write(tmp_path, "notes.txt", "not a theme")
    themes, errors = load_user_themes(tmp_path)
    assert sorted(themes) == ["alpha", "nordish"]
    assert [e.path for e in errors] == [bad]


def test_duplicate_name_keeps_the_first_file(tmp_path: Path) -> None:
    first = _write(tmp_path, "a.toml", NORDISH)
    second = _write(tmp_path, "b.toml", NORDISH)
    themes, errors = load_user_themes(tmp_path)
    assert list(themes) == ["nordish"]
    assert [e.path for e in errors] == [second]
    assert str(first) in str(errors[0])


def test_missing_directory_is_no_error(tmp_path: Path) -> None:
    assert load_user_themes(tmp_path / "absent") == ({}, [])


def test_xdg_config_home_is_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert user_theme_dir() == tmp_path / "warpdeck" / "themes"


def test_default_config_dir_without_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert user_theme_dir() == tmp_path / ".config" / "warpdeck" / "themes"


def test_all_themes_reads_the_user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    directory = tmp_path / "warpdeck" / "themes"
    directory.mkdir(parents=True)
    _write(directory, "nordish.toml", NORDISH)
    themes, errors = all_themes()
    assert errors == []
    assert set(themes) == {*BUILTIN_THEMES, "nordish"}
