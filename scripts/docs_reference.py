"""The documentation site's generated pages, an mkdocs hook (``mkdocs.yml``: ``hooks``).

:func:`on_files` adds ``cli.md`` (every parser's ``--help``: ``asymvlm`` and the
``pipelines/*.py`` scripts), ``configuration.md`` (every key of the pydantic schemas, from their
JSON schema) and copies of ``cluster/README.md`` and ``benchmarks/README.md``;
:func:`on_page_markdown` fills the ``<!-- asymvlm:... -->`` markers of the hand-written pages
(:data:`MARKERS`). ``python scripts/docs_reference.py OUTPUT_DIR`` writes the pages to a folder.
"""

from __future__ import annotations

import argparse
import html
import importlib.util
import json
import os
import re
import sys
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: The scripts of pipelines/ whose parsers the CLI reference documents, in this order.
PIPELINE_SCRIPTS = ("full", "sweep", "train", "embed", "serve", "search")


def cell(text: Any) -> str:
    """Text for a markdown table cell: one line, HTML and pipes escaped, rST literals as code."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", str(text)).replace("``", "`")
    return html.escape(" ".join(text.split()), quote=False).replace("|", "\\|")


# -- the CLI ------------------------------------------------------------------------------------
def parser_markdown(parser: argparse.ArgumentParser, title: str, level: int) -> list[str]:
    """A parser's ``--help`` under a heading, then its sub-commands'."""
    lines = [f"{'#' * level} `{title}`", "", "```text", parser.format_help().strip(), "```", ""]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                lines += parser_markdown(sub, f"{title} {name}", min(level + 1, 4))
    return lines


def cli_page() -> str:
    """The CLI reference: ``asymvlm`` and the ``pipelines/`` scripts."""
    from asymvlm.cli import build_parser

    lines = ["# Command-line reference", ""]
    lines += ["Every command's `--help`. Bad input gets one `error:` line and exit code 2.", ""]
    lines += parser_markdown(build_parser(), "asymvlm", 2)
    lines += ["## The Ray pipeline scripts", ""]
    lines += ["`python pipelines/NAME.py`, or the entrypoint of `ray job submit`.", ""]
    for name in PIPELINE_SCRIPTS:
        path = os.path.join(ROOT, "pipelines", f"{name}.py")
        spec = importlib.util.spec_from_file_location(f"_docs_pipelines_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        parser = module.build_parser()
        parser.prog = f"pipelines/{name}.py"
        lines += parser_markdown(parser, parser.prog, 3)
    return "\n".join(lines) + "\n"


# -- the configuration --------------------------------------------------------------------------
_TYPES = {"integer": "int", "number": "float", "string": "str", "boolean": "bool"}
_BOUNDS = {
    "minimum": "≥",
    "exclusiveMinimum": ">",
    "maximum": "≤",
    "exclusiveMaximum": "<",
    "minItems": "length ≥",
    "maxItems": "length ≤",
    "minLength": "length ≥",
    "maxLength": "length ≤",
}


def type_text(prop: dict) -> str:
    """A JSON-schema property's type in words (schemas as links to their section)."""
    if not isinstance(prop, dict):  # additionalProperties: true
        return "any"
    if "$ref" in prop:
        name = prop["$ref"].rsplit("/", 1)[1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in prop:
        return " or ".join(type_text(p) for p in prop["anyOf"])
    if "enum" in prop or "const" in prop:
        return " \\| ".join(f"`{v}`" for v in prop.get("enum", [prop.get("const")]))
    kind = prop.get("type", "any")
    if kind == "array":
        return "list of " + type_text(prop.get("items", {}))
    if kind == "object":
        return "map str → " + type_text(prop.get("additionalProperties", {}))
    return _TYPES.get(kind, kind)


def range_text(prop: dict) -> str:
    """The bounds of a property and of its items (``each > 0``)."""
    out = [f"{sign} {prop[key]}" for key, sign in _BOUNDS.items() if key in prop]
    items = prop.get("items", {})
    out += [f"each {sign} {items[key]}" for key, sign in _BOUNDS.items() if key in items]
    return ", ".join(out)


def schema_markdown(title: str, model: Any, intro: str, done: set[str]) -> list[str]:
    """A section per schema under ``title``: ``model``'s and those it holds, each schema once."""
    from pydantic import TypeAdapter

    root = TypeAdapter(model).json_schema()
    schemas = {model.__name__: root, **root.get("$defs", {})}
    lines = [f"## {title}", "", intro, ""]
    for name, schema in schemas.items():
        if name in done:
            continue
        done.add(name)
        lines += [f"### {name}", "", cell(schema.get("description", "").split("\n\n")[0]), ""]
        lines += ["| key | type | default | range | description |", "|---|---|---|---|---|"]
        for key, prop in schema.get("properties", {}).items():
            default = "**required**" if key in schema.get("required", ()) else "(its defaults)"
            if "default" in prop:
                default = f"`{json.dumps(prop['default'])}`"
            lines.append(
                f"| `{key}` | {type_text(prop)} | {cell(default)} | {cell(range_text(prop))} | "
                f"{cell(prop.get('description', ''))} |"
            )
        lines.append("")
    return lines


def config_roots() -> list[tuple[str, Any, str]]:
    """The schemas the configuration reference documents, with where each is used."""
    from asymvlm.curation import CurateConfig
    from asymvlm.embedding.embed_config import EmbedConfig
    from asymvlm.indexing import IndexSettings
    from asymvlm.runner import RunSpec
    from asymvlm_ray.schema import PipelineConfig, SearchConfig, ServeConfig, SweepConfig
    from asymvlm_ray.schema.pipeline_config import EVALUATION_ITEMS

    return [
        (
            "The pipeline",
            PipelineConfig,
            "`pipelines/full.py --config FILE.yaml` (`configs/*.yaml`); `--set key=value` "
            "overrides any key (dots and list indices: `sweeps.0.epochs=5`).",
        ),
        ("A sweep", SweepConfig, "`pipelines/sweep.py --config` and the pipeline's `sweeps`."),
        ("One training run", RunSpec, "`asymvlm train`, `pipelines/train.py`, a sweep's trial."),
        ("An embedding job", EmbedConfig, "`asymvlm embed`, `pipelines/embed.py`, `embed.jobs`."),
        *[
            (f"Evaluation `{kind}`", model, f"An item of `evaluations` with `kind: {kind}`.")
            for kind, model in EVALUATION_ITEMS.items()
        ],
        ("Serve", ServeConfig, "`pipelines/serve.py --config FILE.yaml` and its flags."),
        ("An index", IndexSettings, "`asymvlm index` and `asymvlm.build_index`."),
        ("Search on Serve", SearchConfig, "`pipelines/search.py --config FILE.yaml`."),
        (
            "A curation job",
            CurateConfig,
            "`asymvlm curate` and `pipelines/curate.py --config FILE.yaml` "
            "(`configs/curate.yaml`); its `rules` are `SelectionRule`s.",
        ),
    ]


def config_page() -> str:
    """The configuration reference."""
    lines = ["# Configuration reference", ""]
    lines += ["Every key the code validates. Unknown keys are refused, the closest one named.", ""]
    done = {model.__name__ for _, model, _ in config_roots()}  # each root in its own section
    for title, model, intro in config_roots():
        done.discard(model.__name__)
        lines += schema_markdown(title, model, intro, done)
    return "\n".join(lines) + "\n"


def undocumented_fields() -> list[str]:
    """``Schema.key`` of every documented field without a description (should be none)."""
    from pydantic import TypeAdapter

    missing = []
    for _, model, _ in config_roots():
        root = TypeAdapter(model).json_schema()
        for name, schema in {model.__name__: root, **root.get("$defs", {})}.items():
            props = schema.get("properties", {})
            missing += [f"{name}.{k}" for k, p in props.items() if not p.get("description")]
    return sorted(set(missing))


# -- tables from registries ---------------------------------------------------------------------
def methods_table() -> str:
    """Every registered method, what it is and its uncertainty (``asymvlm methods``)."""
    from asymvlm.methods import METHODS

    lines = ["| method | what | uncertainty (higher = more uncertain) |", "|---|---|---|"]
    for name in sorted(METHODS):
        cls = METHODS[name]
        doc = (cls.__doc__ or "").strip().splitlines()
        lines.append(f"| `{name}` | {cell(doc[0] if doc else '')} | {cell(cls.uncertainty_doc)} |")
    return "\n".join(lines) + "\n"


def metrics_table() -> str:
    """Every final metric's MLflow name and meaning."""
    from asymvlm.metrics.glossary import DIRECTION_MEANINGS, METRIC_MEANINGS

    lines = ["| MLflow name | what it says |", "|---|---|"]
    for name, meaning in METRIC_MEANINGS.items():
        shown = f"`{name}`" if name == "rsum" else f"`t2i_{name}`, `i2t_{name}`"
        lines.append(f"| {shown} | {cell(meaning)} |")
    lines += ["", *(f"* **{d}**: {cell(m)}" for d, m in DIRECTION_MEANINGS.items())]
    return "\n".join(lines) + "\n"


def _copied(path: str, note: str) -> Callable[[], str]:
    def page() -> str:
        with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
            title, _, rest = fh.read().partition("\n")
        rest = rest.replace("](../docs/", "](")  # the docs folder is the site's root
        return f"{title}\n\n*{note} (`{path}`).*\n{rest}"

    return page


#: Generated page -> the function that writes it.
PAGES: dict[str, Callable[[], str]] = {
    "cli.md": cli_page,
    "configuration.md": config_page,
    "cluster.md": _copied("cluster/README.md", "This page is the repository's cluster guide"),
    "benchmarks.md": _copied("benchmarks/README.md", "This page is the benchmarks' README"),
}

#: Markers in hand-written pages -> what replaces them.
MARKERS: dict[str, Callable[[], str]] = {
    "<!-- asymvlm:methods-table -->": methods_table,
    "<!-- asymvlm:metrics-table -->": metrics_table,
}


# -- the mkdocs hook ----------------------------------------------------------------------------
def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages to the site (mkdocs >= 1.6: ``File.generated``)."""
    from mkdocs.structure.files import File

    for uri, make in PAGES.items():
        existing = files.get_file_from_path(uri)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, uri, content=make()))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Fill the markers (:data:`MARKERS`) of a page."""
    for marker, make in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown


if __name__ == "__main__":
    for uri, make in PAGES.items():
        os.makedirs(sys.argv[1], exist_ok=True)
        with open(os.path.join(sys.argv[1], uri), "w", encoding="utf-8") as fh:
            fh.write(make())
