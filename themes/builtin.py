"""The four built-in themes and the domain colour variables every warpdeck theme defines.

The TUI's CSS names domain colours only through `$wd-*` variables, never literal colours, so a theme
is the single place a palette lives, and a theme that lacks one of these variables would break the
stylesheet. That is why every theme here (and every user theme, see `user.py`) defines all of them.

Phase colours (fill, h2d, compute, d2h, sink) sit next to each other as bars on the timeline, so in
each theme they are chosen to stay apart in hue and lightness, not only in name.
"""

from __future__ import annotations

from textual.theme import Theme

DOMAIN_VARIABLES: tuple[str, ...] = (
    # Task states and pipeline phases: board columns and timeline bars.
    "wd-queued",
    "wd-fill",
    "wd-h2d",
    "wd-compute",
    "wd-d2h",
    "wd-sink",
    "wd-done",
    "wd-failed",
    "wd-cancelled",
    # Stall reasons: why a lane is not busy.
    "wd-stall-memory",
    "wd-stall-control",
    "wd-stall-backpressure",
    "wd-stall-worker-lost",
    "wd-stall-hung",
    # Timeline gaps where a lane did nothing.
    "wd-idle",
    # Worker liveness, from the heartbeat monitor.
    "wd-worker-online",
    "wd-worker-late",
    "wd-worker-stale",
    "wd-worker-dead",
    "wd-worker-quarantined",
)
"""Names of the extra CSS variables every warpdeck theme defines (use them as `$wd-compute`)."""

PHASE_VARIABLES: tuple[str, ...] = ("wd-fill", "wd-h2d", "wd-compute", "wd-d2h", "wd-sink")
"""The phase colours drawn as adjacent timeline bars; each theme keeps these apart."""

DEFAULT_THEME = "warpdeck-dark"
"""The theme the TUI starts with when the user has chosen none."""

_DARK = Theme(
    name="warpdeck-dark",
    # Low-glare slate with muted accents: meant to be stared at for a whole training run.
    primary="#6fa8dc",
    secondary="#8a9bb8",
    accent="#d9a05b",
    warning="#e5c07b",
    error="#e06c75",
    success="#8fc58b",
    foreground="#d4d8e0",
    background="#1b1f27",
    surface="#232833",
    panel="#2c3240",
    dark=True,
    variables={
        "wd-queued": "#878fa0",
        "wd-fill": "#d9a05b",
        "wd-h2d": "#5fa8d3",
        "wd-compute": "#8fc58b",
        "wd-d2h": "#b48ead",
        "wd-sink": "#ec6f5a",
        "wd-done": "#6d9f71",
        "wd-failed": "#e06c75",
        "wd-cancelled": "#9b8f80",
        "wd-stall-memory": "#c678dd",
        "wd-stall-control": "#61afef",
        "wd-stall-backpressure": "#e5c07b",
        "wd-stall-worker-lost": "#f0a35e",
        "wd-stall-hung": "#ff5f87",
        "wd-idle": "#3a404c",
        "wd-worker-online": "#8fc58b",
        "wd-worker-late": "#e5c07b",
        "wd-worker-stale": "#e07f5f",
        "wd-worker-dead": "#e06c75",
        "wd-worker-quarantined": "#c678dd",
        "footer-key-foreground": "#6fa8dc",
    },
)

_LIGHT = Theme(
    name="warpdeck-light",
    # Darker, more saturated inks than the dark theme: pale colours vanish on a light background.
    primary="#2f6db5",
    secondary="#5a6b8c",
    accent="#935d00",
    warning="#935d00",
    error="#c0392b",
    success="#2a7130",
    foreground="#1f2430",
    background="#f5f6f8",
    surface="#e9ecf1",
    panel="#dde2ea",
    dark=False,
    variables={
        "wd-queued": "#60677a",
        "wd-fill": "#946300",
        "wd-h2d": "#1a6aa0",
        "wd-compute": "#25743a",
        "wd-d2h": "#8e44ad",
        "wd-sink": "#b8401f",
        "wd-done": "#1b5e20",
        "wd-failed": "#c0392b",
        "wd-cancelled": "#7a6a58",
        "wd-stall-memory": "#9c27b0",
        "wd-stall-control": "#1565c0",
        "wd-stall-backpressure": "#935d00",
        "wd-stall-worker-lost": "#b34700",
        "wd-stall-hung": "#c2185b",
        "wd-idle": "#cdd3dc",
        "wd-worker-online": "#2a7130",
        "wd-worker-late": "#935d00",
        "wd-worker-stale": "#b34700",
        "wd-worker-dead": "#c0392b",
        "wd-worker-quarantined": "#8e44ad",
        "footer-key-foreground": "#2f6db5",
    },
)

_HIGH_CONTRAST = Theme(
    name="warpdeck-high-contrast",
    # Black background and pure, saturated inks; every domain colour reaches at least 4.5:1 against
    # the background (WCAG AA for text), so blue is lightened rather than pure #0000ff.
    primary="#00c8ff",
    secondary="#ffffff",
    accent="#ffff00",
    warning="#ffff00",
    error="#ff3b3b",
    success="#00ff00",
    foreground="#ffffff",
    background="#000000",
    surface="#000000",
    panel="#1a1a1a",
    dark=True,
    luminosity_spread=0.25,
    text_alpha=1.0,
    variables={
        "wd-queued": "#c0c0c0",
        "wd-fill": "#ffff00",
        "wd-h2d": "#00ffff",
        "wd-compute": "#00ff00",
        "wd-d2h": "#ff00ff",
        "wd-sink": "#ff8000",
        "wd-done": "#ffffff",
        "wd-failed": "#ff3b3b",
        "wd-cancelled": "#a0a0a0",
        "wd-stall-memory": "#ff66ff",
        "wd-stall-control": "#6699ff",
        "wd-stall-backpressure": "#ffd700",
        "wd-stall-worker-lost": "#ff9966",
        "wd-stall-hung": "#ff3b3b",
        "wd-idle": "#808080",
        "wd-worker-online": "#00ff00",
        "wd-worker-late": "#ffff00",
        "wd-worker-stale": "#ff8000",
        "wd-worker-dead": "#ff3b3b",
        "wd-worker-quarantined": "#ff00ff",
        "footer-key-foreground": "#ffff00",
        "border": "#ffffff",
    },
)

_ANSI = Theme(
    name="warpdeck-ansi",
    # Named ANSI colours only, so the terminal's own 16-colour palette decides the actual shades
    # (as Textual's ansi-dark does); the background and text follow the terminal's defaults.
    ansi=True,
    primary="ansi_blue",
    secondary="ansi_cyan",
    accent="ansi_magenta",
    warning="ansi_yellow",
    error="ansi_red",
    success="ansi_green",
    foreground="ansi_default",
    background="ansi_default",
    surface="ansi_default",
    panel="ansi_default",
    boost="ansi_default",
    dark=True,
    variables={
        "wd-queued": "ansi_white",
        "wd-fill": "ansi_yellow",
        "wd-h2d": "ansi_blue",
        "wd-compute": "ansi_green",
        "wd-d2h": "ansi_magenta",
        "wd-sink": "ansi_cyan",
        "wd-done": "ansi_bright_green",
        "wd-failed": "ansi_red",
        "wd-cancelled": "ansi_bright_black",
        "wd-stall-memory": "ansi_bright_magenta",
        "wd-stall-control": "ansi_bright_blue",
        "wd-stall-backpressure": "ansi_bright_yellow",
        "wd-stall-worker-lost": "ansi_bright_cyan",
        "wd-stall-hung": "ansi_bright_red",
        "wd-idle": "ansi_bright_black",
        "wd-worker-online": "ansi_green",
        "wd-worker-late": "ansi_yellow",
        "wd-worker-stale": "ansi_bright_yellow",
        "wd-worker-dead": "ansi_red",
        "wd-worker-quarantined": "ansi_magenta",
        # Borrowed from Textual's ansi-dark so cursors and selections stay readable.
        "ansi-background": "ansi_black",
        "ansi-foreground": "ansi_white",
        "border-blurred": "ansi_black",
        "block-cursor-foreground": "ansi_black",
        "block-cursor-background": "ansi_white",
        "input-cursor-background": "ansi_black",
        "input-cursor-foreground": "ansi_bright_white",
        "input-cursor-text-style": "none",
        "input-selection-background": "ansi_bright_blue",
        "input-selection-foreground": "ansi_black",
        "screen-selection-background": "ansi_bright_blue",
        "screen-selection-foreground": "ansi_black",
    },
)

BUILTIN_THEMES: dict[str, Theme] = {theme.name: theme for theme in (_DARK, _LIGHT, _HIGH_CONTRAST, _ANSI)}
"""warpdeck's own themes by name; register each with `App.register_theme`. Treat as read-only."""
