"""Every command and option of ``warpdeck`` is documented, and the README stays a front door.

The decision this protects (issue 30): the command line is a contract and docs/cli.md is its
reference. The checks read the parser ``warpdeck`` itself builds, so an option added to it without
its place in the page's synopsis and a line that explains it fails here, and so does a synopsis
that names an option its command no longer has. The README stays under 150 lines, its example is
the example file it names, its exit-status table is the command's statuses, and every relative link
in it and in docs/cli.md opens a file (and a heading, where it names one) that exists.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path

import pytest

from warpdeck.engine.api import ExitStatus

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CLI_DOC = ROOT / "docs" / "cli.md"
_ARGPARSE_HELP = frozenset({"-h", "--help"})
"""argparse's own; every parser has it, and cli.md says so once."""
_FENCE = re.compile(r"^```.*?^```[^\n]*$", re.MULTILINE | re.DOTALL)
_OPTION = re.compile(r"(?<![\w-])--?[A-Za-z][\w-]*")


def _commands() -> dict[str, argparse.ArgumentParser]:
    """The parser ``warpdeck`` runs with, by command ("" for ``warpdeck`` itself)."""
    from warpdeck.cli.main import _parser

    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"": parser, **sub.choices}


def _options(parser: argparse.ArgumentParser, command: str) -> set[str]:
    found = {s for action in parser._actions for s in action.option_strings}
    return found - {"-h"} if command == "" else found - _ARGPARSE_HELP


def _synopsis(doc: str, commands: set[str]) -> dict[str, set[str]]:
    """The options each command's lines in the page's first code block name (comments aside)."""
    block = doc[doc.index("## Synopsis"):]
    block = block[block.index("```") + 3:]
    block = block[block.index("\n") + 1:block.index("```")]
    named: dict[str, set[str]] = {}
    command = ""
    for line in block.splitlines():
        text = line.split(" # ")[0]
        if text.startswith("warpdeck "):
            word = text.split()[1]
            command = word if word in commands else ""
        named.setdefault(command, set()).update(_OPTION.findall(text))
    return named


def _sections(doc: str) -> dict[str, str]:
    """The page's ``##`` sections by heading, code blocks left out."""
    parts = re.split(r"^## (.*)$", _FENCE.sub("", doc), flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_command_has_its_section_and_synopsis() -> None:
    doc = CLI_DOC.read_text(encoding="utf-8")
    commands = set(_commands()) - {""}
    headings = " ".join(_sections(doc))
    synopsis = _synopsis(doc, commands)
    for command in commands:
        assert f"`warpdeck {command}`" in headings, command
        assert command in synopsis, command


def test_the_synopsis_names_exactly_the_options_of_each_command() -> None:
    parsers = _commands()
    synopsis = _synopsis(CLI_DOC.read_text(encoding="utf-8"), set(parsers) - {""})
    wrong = {command or "warpdeck": {"undocumented": sorted(options - named), "gone": sorted(named - options)}
             for command, parser in parsers.items()
             if (options := _options(parser, command)) != (named := synopsis.get(command, set()))}
    assert wrong == {}


def test_every_option_is_explained_under_its_command() -> None:
    sections = _sections(CLI_DOC.read_text(encoding="utf-8"))
    unexplained = []
    for command, parser in _commands().items():
        if command:
            text = " ".join(body for heading, body in sections.items() if f"`warpdeck {command}`" in heading)
        else:
            text = " ".join(f"{heading}\n{body}" for heading, body in sections.items())
        unexplained += [f"{command or 'warpdeck'} {option}" for option in sorted(_options(parser, command))
                        if not re.search(rf"`{re.escape(option)}[ `]", text)]
    assert unexplained == []


def test_the_readme_is_a_front_door() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) < 150


def test_the_readme_exit_status_table_is_the_commands() -> None:
    readme = README.read_text(encoding="utf-8")
    table = readme[readme.index("| status | the run |"):]
    table = table[:table.index("\n\n")]
    listed = [int(m) for m in re.findall(r"^\| (\d+) \|", table, flags=re.MULTILINE)]
    assert listed == sorted(int(s) for s in ExitStatus)


def test_the_readme_example_is_the_file_it_names() -> None:
    readme = README.read_text(encoding="utf-8")
    section = readme[readme.index("## Your own pipeline"):]
    section = section[:section.index("\n## ")]
    (name,) = set(re.findall(r"\]\((examples/[\w.-]+\.toml)\)", section))
    shown = re.search(r"```toml\n(.*?)```", section, flags=re.DOTALL)
    assert shown is not None
    assert tomllib.loads(shown.group(1)) == tomllib.loads((ROOT / name).read_text(encoding="utf-8"))
    commands = re.search(r"```sh\n(.*?)```", section, flags=re.DOTALL)
    assert commands is not None
    for line in commands.group(1).splitlines():
        words = line.split(" # ")[0].split()
        assert words[:3] in (["warpdeck", "run", name], ["warpdeck", "check", name]), line


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces made hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    return {_slug(h) for h in re.findall(r"^#{1,6} (.*)$", text, flags=re.MULTILINE)}


@pytest.mark.parametrize("page", [README, CLI_DOC], ids=lambda p: p.name)
def test_every_relative_link_opens_what_it_names(page: Path) -> None:
    text = re.sub(r"`[^`\n]*`", "", _FENCE.sub("", page.read_text(encoding="utf-8")))
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for link in links:
        if re.match(r"[a-z][a-z+.-]*:", link):  # https:, mailto:: not this repository's
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.exists(), f"{page.name}: {link}"
        if anchor and target.suffix == ".md":
            assert anchor in _anchors(target), f"{page.name}: {link}"
