"""User theme files: TOML under `$XDG_CONFIG_HOME/warpdeck/themes`, validated into Textual themes.

A user theme must never break the app: a bad file becomes a `ThemeFileError` naming the file and
every bad field, and the other files still load. Every loaded theme defines every `wd-*` domain
variable (taken from its base, or from the built-in dark/light theme when it has none), because the
TUI's stylesheet refers to all of them and a missing variable is a CSS error at start-up.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails
from textual.color import Color, ColorParseError
from textual.theme import BUILTIN_THEMES as TEXTUAL_THEMES
from textual.theme import Theme

from .builtin import BUILTIN_THEMES, DOMAIN_VARIABLES

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_FILE_FIELD = "(file)"
"""The field named by issues about the file as a whole (unreadable, not TOML)."""


def _colour(value: str) -> str:
    """Accept only what Textual can parse, so a bad colour fails here and not in the stylesheet."""
    try:
        Color.parse(value)
    except ColorParseError:
        raise ValueError(f"not a colour: {value!r}") from None
    return value


def _variable_name(value: str) -> str:
    """Refuse names the TUI does not use: a typo would otherwise be silently ignored."""
    if value not in DOMAIN_VARIABLES:
        raise ValueError(f"unknown variable {value!r}; known: {', '.join(DOMAIN_VARIABLES)}")
    return value


ColourText = Annotated[str, AfterValidator(_colour)]
DomainVariable = Annotated[str, AfterValidator(_variable_name)]


class ThemeColors(BaseModel):
    """Textual's base colours; any not given come from the base theme, or Textual derives them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    primary: ColourText | None = None
    """Main accent: focused borders, highlights. Required when the theme has no `base`."""
    secondary: ColourText | None = None
    """Second accent colour."""
    accent: ColourText | None = None
    """Draws the eye to key elements, such as footer keys."""
    warning: ColourText | None = None
    """Warnings and notifications of things to check."""
    error: ColourText | None = None
    """Errors and destructive actions."""
    success: ColourText | None = None
    """Success and healthy states."""
    foreground: ColourText | None = None
    """Default text colour."""
    background: ColourText | None = None
    """Screen background."""
    surface: ColourText | None = None
    """Background of widgets drawn on the screen."""
    panel: ColourText | None = None
    """Background of panels that stand out from the surface."""
    boost: ColourText | None = None
    """A translucent colour layered on a surface to lift it slightly."""


class ThemeFile(BaseModel):
    """One user theme file, as written in TOML."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """The theme's name, as chosen in the app; must not be a built-in theme's name."""
    base: str | None = None
    """A built-in theme to start from: every colour and variable not given here is taken from it."""
    dark: bool | None = None
    """Whether this is a dark theme; defaults to the base's, or true without a base."""
    colors: ThemeColors = ThemeColors()
    """Textual's base colours (`[colors]` table)."""
    variables: dict[DomainVariable, ColourText] = Field(default_factory=dict)
    """The `wd-*` domain colours (`[variables]` table), any subset of `DOMAIN_VARIABLES`."""

    @field_validator("name")
    @classmethod
    def _name_is_free(cls, value: str) -> str:
        # Registering a theme under an existing name silently replaces it in Textual.
        if not _NAME.match(value):
            raise ValueError(f"not a usable theme name: {value!r} (letters, digits, '-', '_', '.')")
        if value in BUILTIN_THEMES or value in TEXTUAL_THEMES:
            raise ValueError(f"{value!r} is a built-in theme; choose another name")
        return value

    @field_validator("base")
    @classmethod
    def _base_is_builtin(cls, value: str | None) -> str | None:
        if value is not None and value not in BUILTIN_THEMES:
            raise ValueError(f"unknown base theme {value!r}; choose one of: {', '.join(BUILTIN_THEMES)}")
        return value

    def to_theme(self) -> Theme:
        """Build the Textual theme, filling what is not given from the base (see module docstring).

        Raises `ValueError` when there is no base and no `colors.primary` (Textual needs one);
        `load_theme_file` reports that as a field error before calling this.
        """
        given = self.colors.model_dump(exclude_none=True)
        if self.base is not None:
            base = BUILTIN_THEMES[self.base]
            dark = base.dark if self.dark is None else self.dark
            variables = {**base.variables, **self.variables}
            return dataclasses.replace(base, name=self.name, dark=dark, variables=variables, **given)
        if self.colors.primary is None:
            raise ValueError("colors.primary is required when the theme has no base")
        dark = True if self.dark is None else self.dark
        # Without a base, only the domain variables are borrowed: they are what the TUI needs.
        fallback = BUILTIN_THEMES["warpdeck-dark" if dark else "warpdeck-light"].variables
        variables = {name: fallback[name] for name in DOMAIN_VARIABLES} | self.variables
        return Theme(name=self.name, dark=dark, variables=variables, **given)


class ThemeFileError(Exception):
    """A theme file that could not be loaded, with every problem found in it.

    `issues` holds `(field, message)` pairs; the field is dotted (`colors.primary`,
    `variables.wd-compute`) or `(file)` when the file as a whole is unreadable or not TOML.
    """

    def __init__(self, path: Path, issues: list[tuple[str, str]]) -> None:
        self.path = path
        self.issues = issues
        super().__init__(path, issues)

    def __str__(self) -> str:
        lines = [f"theme file {self.path} was not loaded:"]
        lines += [f"  {field}: {message}" for field, message in self.issues]
        return "\n".join(lines)


def _issue(error: ErrorDetails) -> tuple[str, str]:
    # Dict keys appear in `loc` with a "[key]" marker when the key itself is bad; the key is enough.
    field = ".".join(str(part) for part in error["loc"] if part != "[key]") or _FILE_FIELD
    if error["type"] == "value_error":
        return field, str(error.get("ctx", {}).get("error", error["msg"]))
    if error["type"] == "extra_forbidden":
        return field, "unknown field"
    if error["type"] == "missing":
        return field, "required"
    return field, error["msg"]


def load_theme_file(path: Path) -> Theme:
    """Read, validate and build one theme file; raise `ThemeFileError` naming every bad field."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ThemeFileError(path, [(_FILE_FIELD, f"cannot read: {exc.strerror or exc}")]) from exc
    except UnicodeDecodeError as exc:
        raise ThemeFileError(path, [(_FILE_FIELD, "not UTF-8 text")]) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ThemeFileError(path, [(_FILE_FIELD, f"not valid TOML: {exc}")]) from exc
    try:
        spec = ThemeFile.model_validate(data)
    except ValidationError as exc:
        raise ThemeFileError(path, [_issue(error) for error in exc.errors()]) from exc
    if spec.base is None and spec.colors.primary is None:
        raise ThemeFileError(path, [("colors.primary", "required when the theme has no base")])
    return spec.to_theme()


def user_theme_dir() -> Path:
    """Where user theme files live: `$XDG_CONFIG_HOME/warpdeck/themes` (default `~/.config/...`)."""
    config = os.environ.get("XDG_CONFIG_HOME")
    # The XDG spec says a relative (or empty) value is invalid and must be ignored.
    root = Path(config) if config and Path(config).is_absolute() else Path.home() / ".config"
    return root / "warpdeck" / "themes"


def load_user_themes(directory: Path | None = None) -> tuple[dict[str, Theme], list[ThemeFileError]]:
    """Load every `*.toml` in `directory` (default `user_theme_dir()`), in name order.

    Returns the themes that loaded and an error per file that did not; one bad file never hides the
    good ones. A missing directory is not an error: most users have no themes of their own.
    """
    directory = user_theme_dir() if directory is None else directory
    themes: dict[str, Theme] = {}
    sources: dict[str, Path] = {}
    errors: list[ThemeFileError] = []
    paths = sorted(directory.glob("*.toml")) if directory.is_dir() else []
    for path in paths:
        try:
            theme = load_theme_file(path)
        except ThemeFileError as error:
            errors.append(error)
            continue
        if theme.name in themes:
            clash = f"{theme.name!r} is already defined in {sources[theme.name]}"
            errors.append(ThemeFileError(path, [("name", clash)]))
            continue
        themes[theme.name] = theme
        sources[theme.name] = path
    return themes, errors


def all_themes(directory: Path | None = None) -> tuple[dict[str, Theme], list[ThemeFileError]]:
    """The built-in themes followed by the user's own, and the errors from user files that failed."""
    user, errors = load_user_themes(directory)
    return {**BUILTIN_THEMES, **user}, errors
