"""warpdeck's themes: the built-in Textual themes, the `wd-*` domain colour variables every theme
defines for the TUI's stylesheet, and the loader for user theme files (TOML).

A leaf package: it may import Textual and pydantic, never the engine, the TUI or the CLI.
"""

from .builtin import BUILTIN_THEMES, DEFAULT_THEME, DOMAIN_VARIABLES
from .user import ThemeFile, ThemeFileError, all_themes, load_theme_file, load_user_themes, user_theme_dir

__all__ = [
    "BUILTIN_THEMES",
    "DEFAULT_THEME",
    "DOMAIN_VARIABLES",
    "ThemeFile",
    "ThemeFileError",
    "all_themes",
    "load_theme_file",
    "load_user_themes",
    "user_theme_dir",
]
