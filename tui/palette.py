"""The command palette's provider: every action from the key table, by name."""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

from warpdeck.tui.keymap import KEYS, Key

__all__ = ["KeyCommands"]


class KeyCommands(Provider):
    """Offers each palette key of the app, and those of the current screen, as a command."""

    def _keys(self) -> list[Key]:
        """The keys to offer: this screen's and the app's, less what the run's state and the room's
        mode do not allow now (``check_action``: a read-only room offers no command)."""
        screen = self.screen.name or ""
        app = self.app
        return [k for k in KEYS if k.palette and k.scope in ("app", screen)
                and app.check_action(k.action.partition("(")[0], ()) is not False]

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
