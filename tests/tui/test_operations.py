"""One operation, one row: every key, every ``:`` verb and every guard comes from ``OPERATIONS``.

These fail when an operation is described a second time: a binding written outside the table, a
verb with no row, a row nothing reaches or help does not list, or a module that maps operation
names to behaviour itself (an ``if action == ...`` chain, a ``match`` on the verb, a set of names).
"""

from __future__ import annotations

import ast
import io
from pathlib import Path

import pytest
from rich.console import Console
from textual.binding import Binding
from textual.dom import DOMNode

from warpdeck.tui.app import WarpdeckApp
from warpdeck.tui.command_line import usage
from warpdeck.tui.keymap import bindings
from warpdeck.tui.operations import GROUPS, KEYS, OPERATIONS, SCOPES, VERBS, operation
from warpdeck.tui.screens.board import BoardScreen
from warpdeck.tui.screens.detail import DetailScreen
from warpdeck.tui.screens.help import HelpScreen, help_table, verb_table
from warpdeck.tui.screens.timeline import TimelineScreen
from warpdeck.tui.screens.workers import WorkersScreen
from warpdeck.tui.widgets.task_list import TaskList

HOSTS: dict[str, type[DOMNode]] = {"app": WarpdeckApp, "board": BoardScreen, "list": TaskList,
                                   "workers": WorkersScreen, "timeline": TimelineScreen}
"""The class whose actions each scope's keys run."""
TUI = Path(__file__).parents[2] / "tui"
NAMES = {op.name for op in OPERATIONS} | set(VERBS)
ACTIONS = {op.name for op in OPERATIONS if op.keys}


def _rendered(table: object) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(table)
    return console.export_text()


def _base(action: str) -> str:
    return action.removeprefix("app.").partition("(")[0]


def test_each_operation_verb_and_key_is_written_once() -> None:
    names = [op.name for op in OPERATIONS]
    verbs = [op.verb.name for op in OPERATIONS if op.verb is not None]
    assert len(names) == len(set(names)) and len(verbs) == len(set(verbs)) == len(VERBS)
    # One key may serve two operations only where at most one applies at a time (p: pause, resume).
    by_key: dict[tuple[str, str], list[str]] = {}
    for k in KEYS:
        for name in k.keys.split(","):
            by_key.setdefault((k.scope, name), []).append(k.action)
    for (scope, name), actions in by_key.items():
        if len(actions) > 1:
            assert all(operation(a) is not None and operation(a).when is not None for a in actions), (scope, name)


@pytest.mark.parametrize("scope", SCOPES)
def test_every_binding_of_a_scope_comes_from_the_table(scope: str) -> None:
    host = HOSTS[scope]
    assert [(b.key, b.action) for b in host.BINDINGS if isinstance(b, Binding)] == [
        (b.key, b.action) for b in bindings(scope) if isinstance(b, Binding)]
    for k in KEYS:
        if k.scope == scope:
            assert operation(_base(k.action)) is not None and k.group in GROUPS, k
            assert callable(getattr(host, f"action_{_base(k.action)}", None)), k


@pytest.mark.parametrize("screen", [HelpScreen, DetailScreen])
def test_a_screen_that_hides_the_apps_keys_binds_them_from_the_table(screen: type[DOMNode]) -> None:
    for b in screen.BINDINGS:
        assert isinstance(b, Binding)
        op = operation(_base(b.action))
        if op is not None:
            assert b.action.startswith("app.") and op.while_reading
            assert b.key in {k.keys for k in op.keys}, b


def test_every_operation_is_reached_and_listed_in_help() -> None:
    keys_help, verbs_help = _rendered(help_table()), _rendered(verb_table())
    for op in OPERATIONS:
        assert op.keys or op.verb is not None, op.name
        for k in op.keys:
            assert k.description in keys_help, k
        if op.verb is not None:
            assert ":" + usage(op.verb.name) in verbs_help, op.verb
            # A verb without arguments runs its operation's app action, as the operation's key does.
            assert op.verb.run is not None or (op.scope == "app" and op.keys
                                               and callable(getattr(WarpdeckApp, f"action_{op.name}", None))), op


def _names_in(node: ast.AST, names: set[str] = NAMES) -> set[str]:
    """The names of ``names`` that ``node`` writes as string literals (alone or in a collection)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & names
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(_names_in(e, names) for e in node.elts)) if node.elts else set()
    return set()


def _is_dispatch_subject(node: ast.AST) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name in ("action", "verb")


def _second_descriptions(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_dispatch_subject(s) for s in sides) and any(_names_in(s) for s in sides):
                found.append(f"line {node.lineno}: compares an action or verb with {_names_in_all(sides)}")
        elif isinstance(node, ast.Match) and _is_dispatch_subject(node.subject):
            found.append(f"line {node.lineno}: a match on an action or verb")
        elif isinstance(node, ast.Tuple | ast.List | ast.Set) and len(_names_in(node, ACTIONS)) >= 2:
            found.append(f"line {node.lineno}: a collection of actions {sorted(_names_in(node, ACTIONS))}")
    return found


def _names_in_all(nodes: list[ast.expr]) -> list[str]:
    return sorted(set().union(*(_names_in(n) for n in nodes)))


def test_no_module_but_the_table_maps_operation_names_to_behaviour() -> None:
    found = {str(path.relative_to(TUI)): lines for path in sorted(TUI.rglob("*.py"))
             if path.name != "operations.py"
             and (lines := _second_descriptions(ast.parse(path.read_text(encoding="utf-8"))))}
    assert found == {}


def test_the_check_finds_the_chains_it_replaced() -> None:
    """The if-chain, guard set and ``match`` the table replaced are what the check above finds."""
    chain = '''
def check_action(self, action, parameters):
    if action == "pause":
        return not self.paused
_ASKS_FIRST = frozenset({"drain", "cancel_task", "cancel_all", "quit_app", "quit"})
async def run_command(self, cmd):
    match cmd.verb:
        case "cancel":
            pass
'''
    assert len(_second_descriptions(ast.parse(chain))) == 3
