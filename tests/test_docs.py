"""The README and docs/: the README opens with the two commands CI and users run and stays a first screen plus a
section per command; every link resolves (file and heading); every option of every command is in its docs page."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
# each command's options are listed on its page (`profile` takes the run options, listed on run's)
PAGES = {("run",): "run.md", ("profile",): "profiling.md run.md", ("trace", "summarize"): "profiling.md",
         ("trace", "compare"): "profiling.md", ("report",): "reports.md", ("parity",): "parity.md",
         ("calibrate",): "confidence.md", ("generate",): "commands.md", ("inspect",): "commands.md",
         ("train-draft",): "commands.md", ("engine-bench",): "commands.md", ("make-tiny",): "commands.md",
         ("fetch-tokenizer",): "commands.md"}


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens and underscores dropped, spaces to
    hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # a `# comment` in a code block is no heading
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_the_readme_opens_with_the_two_commands_and_stays_short():
    text = README.read_text()
    assert len(text.splitlines()) < 300
    first = re.search(r"```bash\n(.*?)```", text, flags=re.S).group(1)  # the quick start's block
    assert "dspark-bench run --split qualitative --category coding" in first
    assert "python -m pytest -q" in first
    ci = (ROOT / ".ci" / "run").read_text()
    assert "\npython -m pytest -q\n" in ci  # CI runs exactly the README's test command


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.name)
def test_every_link_resolves_to_a_file_and_its_heading(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no such heading")
    assert not bad, f"{page.name}: " + "; ".join(bad)


def test_every_page_in_docs_is_linked_from_the_readme():
    text = README.read_text()
    assert [p.name for p in DOCS if f"(docs/{p.name}" not in text] == []


def test_every_option_of_every_command_is_on_its_docs_page():
    import click
    import typer

    from harness.cli import app

    group = typer.main.get_command(app)
    ctx = click.Context(group)
    missing, seen = [], set()
    for path, page in PAGES.items():
        command = group.get_command(ctx, path[0])
        if len(path) > 1:
            command = command.get_command(ctx, path[1])
        text = "".join((ROOT / "docs" / name).read_text() for name in page.split())
        seen.add(path[0])
        for param in command.params:
            if param.param_type_name != "option" or param.hidden or param.name == "help":
                continue
            missing += [f"{' '.join(path)} {o} ({page})" for o in param.opts + param.secondary_opts
                        if f"`{o}`" not in text and f"`{o} " not in text and f"`{o}=" not in text]
    assert not missing, "options no docs page lists: " + ", ".join(missing)
    assert seen == set(group.list_commands(ctx))  # a new command gets a page too


def test_every_test_file_is_in_the_inventory():
    inventory = (ROOT / "docs" / "tests.md").read_text()
    assert [p.name for p in sorted((ROOT / "tests").glob("test_*.py")) if f"`tests/{p.name}`" not in inventory] == []


def test_the_architecture_page_names_every_module_and_only_modules_that_exist():
    page = (ROOT / "docs" / "architecture.md").read_text()
    modules = [p.relative_to(ROOT).as_posix() for folder in ("dspark", "harness") for p in (ROOT / folder).rglob("*.py")
               if p.name not in ("__init__.py", "__main__.py")]
    assert sorted(m for m in modules if f"`{m}`" not in page) == []
    named = set(re.findall(r"`((?:dspark|harness)/[\w/]+\.py)`", page))
    assert sorted(m for m in named if not (ROOT / m).is_file()) == []
