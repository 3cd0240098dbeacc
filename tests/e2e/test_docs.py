"""The documentation site stays true: every code block of its pages runs, the site builds in strict mode
(broken links, missing references and docstring errors fail), and its API reference documents every public
name.

Blocks run as a reader who copies them would: each page's blocks in order, in a fresh folder of their own,
each ```python block saved as a script and run in its own process, each ```sh block run by bash (stopping at
the first failing command) with this environment's `zarrfeed` first on the PATH. ```console blocks show
commands that cannot run here as they stand (installs, servers that run until stopped, buckets, the lead's
benchmark runs); ```text blocks are synopses and outputs. No other kind of block is allowed, so nothing
meant to run is silently skipped.
"""
import html as html_module
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from repo_paths import ROOT
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
RUNS = {"python", "sh"}


def blocks(page: Path) -> list[tuple[str, str]]:
    return BLOCK.findall(page.read_text())


def test_every_block_is_of_a_known_kind():
    kinds = {kind for page in PAGES for kind, _ in blocks(page)}
    assert kinds <= RUNS | {"console", "text"}, kinds
    runnable = [p.relative_to(DOCS).as_posix() for p in PAGES if any(k in RUNS for k, _ in blocks(p))]
    for page in ("getting-started.md", "cli.md", "guides/writing.md", "guides/loading.md", "guides/l5kit.md",
                 "guides/serving.md", "guides/arrow.md", "guides/pictures.md", "guides/dask.md",
                 "guides/diffusion-policy.md", "guides/lerobot.md"):
        assert page in runnable, page


@pytest.mark.parametrize("page", [p for p in PAGES if any(k in RUNS for k, _ in blocks(p))],
                         ids=lambda p: p.relative_to(DOCS).as_posix())
def test_the_code_blocks_of_a_page_run(page, tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for i, (kind, code) in enumerate(blocks(page)):
        if kind == "python":
            script = tmp_path / f"block{i}.py"
            script.write_text(code)
            command = [sys.executable, script.name]
        elif kind == "sh":
            command = ["bash", "-e", "-o", "pipefail", "-c", code]
        else:
            continue
        r = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, f"{page.relative_to(ROOT)} block {i} ({kind}):\n{code[:300]}\n{r.stderr[-3000:]}"


DOCSTRING_BLOCK = re.compile(r"^[ \t]*```python\n(.*?)^[ \t]*```", re.S | re.M)


def test_the_examples_in_public_docstrings_run(tmp_path):
    """Every ```python block in the docstring of a public name (of `zarrfeed`, `zarrfeed.writer`,
    `zarrfeed.loader`, `zarrfeed.flight`; the API reference shows them) runs as written, each in a fresh folder:
    `zarrfeed.convert`'s among them."""
    import inspect
    import textwrap

    import zarrfeed
    import zarrfeed.flight
    import zarrfeed.loader
    import zarrfeed.writer

    found: dict[str, str] = {}
    for module in (zarrfeed, zarrfeed.writer, zarrfeed.loader, zarrfeed.flight):
        for name in module.__all__:
            for i, code in enumerate(DOCSTRING_BLOCK.findall(inspect.getdoc(getattr(module, name)) or "")):
                code = textwrap.dedent(code)
                if code not in found.values():  # (a name exported twice: run once)
                    found[f"{module.__name__}.{name}-{i}"] = code
    assert "zarrfeed.convert-0" in found, sorted(found)
    for where, code in found.items():
        folder = tmp_path / where
        folder.mkdir()
        (folder / "example.py").write_text(code)
        r = subprocess.run([sys.executable, "example.py"], cwd=folder, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{where}:\n{code}\n{r.stderr[-3000:]}"


def test_the_site_builds_strictly_and_documents_every_public_name(tmp_path):
    site = tmp_path / "site"
    # from another folder than the repository's: the config's paths (the changelog's snippet) are its own
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                        "--site-dir", str(site)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    import zarrfeed
    import zarrfeed.flight
    import zarrfeed.loader
    import zarrfeed.plot
    import zarrfeed.writer

    for module, page in ((zarrfeed.writer, "writer"), (zarrfeed.loader, "loader"), (zarrfeed.flight, "flight"),
                         (zarrfeed.plot, "plot")):
        html = (site / "reference" / page / "index.html").read_text()
        for name in module.__all__:
            assert f'id="{module.__name__}.{name}"' in html, f"{module.__name__}.{name} is not in the reference"
    top = (site / "reference" / "zarrfeed" / "index.html").read_text()
    for name in zarrfeed.__all__:
        assert f"<code>{name}</code>" in top, f"zarrfeed.{name} is not in the reference"
    # every public constructor's page lists every parameter it takes, its own and every loader's
    import inspect

    shared = {cls: zarrfeed.loader.LoaderOptions for cls in (zarrfeed.loader.Loader, zarrfeed.loader.WindowLoader,
                                                             zarrfeed.loader.AgentSampleLoader,
                                                             zarrfeed.loader.EgoSampleLoader,
                                                             zarrfeed.loader.SequenceLoader,
                                                             zarrfeed.loader.LeRobotLoader)}
    shared |= {cls: zarrfeed.flight.RemoteOptions for cls in (zarrfeed.flight.RemoteLoader,
                                                              zarrfeed.flight.RemoteWindowLoader,
                                                              zarrfeed.flight.RemoteAgentSampleLoader,
                                                              zarrfeed.flight.RemoteEgoSampleLoader)}
    for module, page in ((zarrfeed.writer, "writer"), (zarrfeed.loader, "loader"), (zarrfeed.flight, "flight"),
                         (zarrfeed.plot, "plot")):
        html = (site / "reference" / page / "index.html").read_text()
        for cls in [getattr(module, n) for n in module.__all__ if inspect.isclass(getattr(module, n))]:
            try:
                signature = inspect.signature(cls)
            except (TypeError, ValueError):
                continue
            start = html.index(f'id="{module.__name__}.{cls.__name__}"')
            section = html[start:html.find('class="doc doc-object doc-class"', start + 1)]
            names = [n for n, p in signature.parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
            names += list(shared[cls].__annotations__) if cls in shared else []
            for name in names:
                assert f"<code>{name}</code>" in section or f'id="{module.__name__}.{cls.__name__}.{name}"' \
                    in section, f"{module.__name__}.{cls.__name__}'s reference does not list {name}"
        # with its default: the options declared by a TypedDict showed "= ..." (docs/option_defaults.py)
        text = html_module.unescape(re.sub(r"<[^>]+>", "", html))
        assert "= ..." not in text, f"reference/{page}: a parameter shows the default '...'"


def test_the_home_page_says_what_the_readme_says():
    """The site's home page repeats the README's opening (what zarrfeed is, the measured figures): one of them
    updated alone left the other claiming old speeds and an old WindowLoader."""
    readme, home = (ROOT / "README.md").read_text(), (DOCS / "index.md").read_text()

    def part(text: str, start: str, end: str) -> str:
        return text[text.index(start):text.index(end)].strip().replace("(docs/", "(")

    for start, end in (("- **Writer**", "## Why not"), ("Measured on this project", "zarrfeed reads and writes")):
        assert part(home, start, end) == part(readme, start, end), start


def test_the_format_number_the_docs_name_is_the_one_written(tmp_path):
    """The changelog and the format page name the manifest's format field and number (they once named a field
    `format` that zarrfeed.json does not have)."""
    import json

    from zarrfeed.writer import synthetic, write_dataset

    write_dataset(tmp_path / "d.zarr", synthetic.episodes(1, seed=0), workers=0)
    number = json.loads((tmp_path / "d.zarr" / "zarrfeed.json").read_text())["zarrfeed"]
    said = f"the field `zarrfeed` of `zarrfeed.json`, {number} in this version"
    assert said in " ".join((ROOT / "CHANGELOG.md").read_text().split())
    page = " ".join((DOCS / "guides/format.md").read_text().split())
    assert f"its field `zarrfeed` says the format, {number};" in page
