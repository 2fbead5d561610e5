"""The command palette's provider: every action from the key table, by name."""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

from warpdeck.tui.keymap import KEYS, Key

__all__ = ["KeyCommands"]


class KeyCommands(Provider):
    """Offers each palette key of the app, and those of the current screen, as a command."""

    def _keys(self) -> list[Key]:
        screen = self.screen.name or ""
        return [k for k in KEYS if k.palette and k.scope in ("app", screen)]

    def _run(self, key: Key) -> None:
        target = self.app if key.scope == "app" else self.screen
        self.app.call_later(target.run_action, key.action)

    async def discover(self) -> Hits:
        for key in self._keys():
            yield DiscoveryHit(key.description, partial(self._run, key), help=f"key: {key.label}")

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for key in self._keys():
            score = matcher.match(key.description)
            if score > 0:
                yield Hit(score, matcher.highlight(key.description), partial(self._run, key), help=f"key: {key.label}")
