"""The documentation site's generated pages, built from the code at every ``mkdocs build``.

An mkdocs hook (``mkdocs.yml``: ``hooks: [scripts/docs_reference.py]``): :func:`on_files` adds
pages that cannot drift from the code, because they are made from it:

* ``cli.md`` -- every command and option, from the argparse parsers
  (:func:`asymvlm.cli.build_parser` and ``pipelines/*.py``'s ``build_parser``);
* ``configuration.md`` -- every configuration key with its type, default, range and
  description, from the pydantic schemas (the pipeline, a sweep, one run, an embedding job,
  the evaluations, Serve);
* ``cluster.md``, ``benchmarks.md`` -- ``cluster/README.md`` and ``benchmarks/README.md``;

and :func:`on_page_markdown` fills the markers of the hand-written pages (:data:`MARKERS`:
``<!-- asymvlm:methods-table -->`` -- the method registry, as ``asymvlm methods``;
``<!-- asymvlm:metrics-table -->`` -- :data:`asymvlm.results.METRIC_MEANINGS`).

``python scripts/docs_reference.py OUTPUT_DIR`` writes the generated pages into a folder.
"""

from __future__ import annotations

import argparse
import enum
import html
import importlib.util
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # the hook runs from mkdocs, the checkout need not be on the path
    sys.path.insert(0, ROOT)

#: The scripts of pipelines/ whose parsers the CLI reference documents, in this order.
PIPELINE_SCRIPTS = ("full", "sweep", "train", "embed", "serve")


# -- markdown helpers ---------------------------------------------------------------------------
def cell(text: Any) -> str:
    """Text for a markdown table cell: HTML escaped, pipes and emphasis characters escaped
    outside `code spans`, on one line."""
    parts = rst_to_markdown(str(text).replace("\n", " ")).split("`")
    out = []
    for i, part in enumerate(parts):
        if i % 2:  # inside a code span
            out.append("`" + part.replace("|", "\\|") + "`")
        else:
            part = html.escape(part, quote=False)
            out.append(re.sub(r"([|*_\[\]])", r"\\\1", part))
    if len(parts) % 2 == 0:  # an unmatched backtick: keep it literal
        out[-1] = out[-1].lstrip("`")
        out.insert(len(out) - 1, "\\`")
    return "".join(out).strip()


def anchor(name: str) -> str:
    """The anchor mkdocs gives a heading ``name``."""
    return re.sub(r"[^\w\- ]", "", name.lower()).strip().replace(" ", "-")


# -- the CLI ------------------------------------------------------------------------------------
def _pipeline_parser(name: str) -> argparse.ArgumentParser:
    path = os.path.join(ROOT, "pipelines", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_docs_pipelines_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_parser()


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    params = {**vars(action), "prog": parser.prog}
    params = {k: (v.__name__ if hasattr(v, "__name__") else v) for k, v in params.items()}
    try:
        return action.help % params
    except (KeyError, TypeError, ValueError):
        return action.help


def _default(action: argparse.Action) -> str:
    default = action.default
    if action.required or default in (None, argparse.SUPPRESS, False, []):
        return "required" if action.required else ""
    return f"`{default}`"


#: Choices longer than this (joined) are listed in the help column, not in the flag's cell.
_INLINE_CHOICES = 30


def _choices(action: argparse.Action) -> list[str]:
    if action.choices is None or isinstance(action, argparse._SubParsersAction):
        return []
    return [str(c) for c in action.choices]


def _option(action: argparse.Action) -> str:
    names = ", ".join(action.option_strings) or (action.metavar or action.dest)
    if action.nargs == 0:
        return f"`{names}`"
    metavar = action.metavar
    choices = _choices(action)
    if choices and len(",".join(choices)) <= _INLINE_CHOICES:
        metavar = "{" + ",".join(choices) + "}"
    metavar = metavar or action.dest.upper()
    if isinstance(metavar, tuple):
        metavar = " ".join(metavar)
    if not action.option_strings:
        return f"`{metavar}`" + (" ..." if action.nargs in ("*", "+") else "")
    return f"`{names} {metavar}`" + (
        " (repeat)" if isinstance(action, argparse._AppendAction) else ""
    )


def parser_markdown(parser: argparse.ArgumentParser, title: str, level: int = 2) -> list[str]:
    """One parser's section: usage, description, the options as a table, then its
    sub-commands' sections."""
    lines = [f"{'#' * level} `{title}`", ""]
    usage = " ".join(parser.format_usage().removeprefix("usage: ").split())
    lines += ["```text", usage, "```", ""]
    if parser.description:
        lines += [" ".join(parser.description.split()), ""]
    rows, subparsers = [], None
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            subparsers = action
            continue
        what = _help(parser, action)
        choices = _choices(action)
        if choices and len(",".join(choices)) > _INLINE_CHOICES:
            what += " (one of: " + ", ".join(f"`{c}`" for c in choices) + ")"
        rows.append(
            f"| {cell(_option(action)).replace(chr(92) + '`', '`')} | "
            f"{_default(action)} | {cell(what)} |"
        )
    if rows:
        lines += ["| option | default | what |", "|---|---|---|", *rows, ""]
    if subparsers is not None:
        helps = {a.dest: a.help or "" for a in subparsers._choices_actions}
        lines += ["| command | what |", "|---|---|"]
        for name in subparsers.choices:
            ref = anchor(f"{title} {name}")
            lines.append(f"| [`{name}`](#{ref}) | {cell(helps.get(name, ''))} |")
        lines.append("")
        for name, sub in subparsers.choices.items():
            lines += parser_markdown(sub, f"{title} {name}", min(level + 1, 4))
    return lines


def cli_page() -> str:
    """The CLI reference: ``asymvlm`` and the ``pipelines/`` scripts."""
    from asymvlm.cli import build_parser

    lines = [
        "# Command-line reference",
        "",
        "Generated from the argparse parsers at every build of this site "
        "(`asymvlm.cli.build_parser()` and the `build_parser()` of each `pipelines/*.py`), "
        "so it lists exactly what `--help` says. Every command prints one `error:` line and "
        "exits 2 on bad input.",
        "",
    ]
    lines += parser_markdown(build_parser(), "asymvlm")
    lines += [
        "## The Ray pipeline scripts",
        "",
        "Run as `python pipelines/NAME.py` locally or as the entrypoint of "
        "`ray job submit --working-dir . -- python pipelines/NAME.py ...` on a cluster.",
        "",
    ]
    for name in PIPELINE_SCRIPTS:
        parser = _pipeline_parser(name)
        parser.prog = f"pipelines/{name}.py"
        lines += parser_markdown(parser, f"pipelines/{name}.py", 3)
    return "\n".join(lines) + "\n"


# -- the configuration --------------------------------------------------------------------------
def _fields(model: Any) -> dict[str, Any]:
    """Field name -> pydantic FieldInfo of a model or a pydantic dataclass."""
    if hasattr(model, "model_fields"):
        return dict(model.model_fields)
    return dict(getattr(model, "__pydantic_fields__", {}))


def _is_schema(tp: Any) -> bool:
    return isinstance(tp, type) and (
        hasattr(tp, "model_fields") or hasattr(tp, "__pydantic_fields__")
    )


_BOUNDS = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"))


def _constraints_of(meta: Iterable[Any]) -> list[str]:
    out = []
    for item in meta:
        for attr, sign in _BOUNDS:
            value = getattr(item, attr, None)
            if value is not None and type(item).__name__ in (attr.title(), "FieldInfo", "Interval"):
                out.append(f"{sign} {value}")
        for attr, label in (("min_length", "length ≥"), ("max_length", "length ≤")):
            value = getattr(item, attr, None)
            if value is not None and type(item).__name__ in ("MinLen", "MaxLen", "FieldInfo"):
                out.append(f"{label} {value}")
        if getattr(item, "allow_inf_nan", None) is False:
            out.append("finite")
        if hasattr(item, "metadata") and type(item).__name__ == "FieldInfo":
            out += _constraints_of(item.metadata)
    return list(dict.fromkeys(out))


def _describe(tp: Any, found: list[Any]) -> tuple[str, list[str]]:
    """(the type in words, the constraints inside it); schemas met are appended to ``found``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        inner, constraints = _describe(args[0], found)
        return inner, _constraints_of(args[1:]) + constraints
    if origin in (typing.Union, types.UnionType):
        parts, constraints = [], []
        for arg in args:
            if arg is type(None):
                continue
            text, more = _describe(arg, found)
            parts.append(text)
            constraints += more
        text = " or ".join(parts)
        return (text + " or null" if type(None) in args else text), constraints
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args), []
    if origin in (list, tuple, set, frozenset):
        inner, constraints = _describe(args[0], found) if args else ("any", [])
        return f"list of {inner}", [f"each {c}" for c in constraints]
    if origin is dict:
        key, _ = _describe(args[0], found) if args else ("str", [])
        value, _ = _describe(args[1], found) if len(args) > 1 else ("any", [])
        return f"map {key} → {value}", []
    if _is_schema(tp):
        if tp not in found:
            found.append(tp)
        return f"[{tp.__name__}](#{anchor(tp.__name__)})", []
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return " \\| ".join(f"`{m.value}`" for m in tp), []
    if tp is typing.Any:
        return "any", []
    return getattr(tp, "__name__", str(tp)), []


def _default_of(info: Any) -> str:
    from pydantic_core import PydanticUndefined

    if info.default_factory is not None:
        try:
            value = info.default_factory()
        except TypeError:
            return "(computed)"
        if _is_schema(type(value)):
            return "(its defaults)"
        return f"`{value!r}`"
    if info.default is PydanticUndefined or info.is_required():
        return "**required**"
    if info.default is None:
        return "`null`"
    if isinstance(info.default, bool):
        return f"`{str(info.default).lower()}`"
    return (
        f"`{info.default!r}`".replace("'", '"')
        if isinstance(info.default, str)
        else f"`{info.default!r}`"
    )


def schema_rows(model: Any, found: list[Any]) -> list[tuple[str, str, str, str, str]]:
    """(key, type, default, range, description) for each field of ``model``."""
    rows = []
    for name, info in _fields(model).items():
        text, constraints = _describe(info.annotation, found)
        constraints = _constraints_of(info.metadata) + constraints
        rows.append(
            (
                name,
                text,
                _default_of(info),
                ", ".join(dict.fromkeys(constraints)),
                info.description or "",
            )
        )
    return rows


def rst_to_markdown(text: str) -> str:
    """A docstring's reStructuredText roles and literals as markdown code spans
    (``:class:`~a.b.C``` -> ```C```, double backticks -> single)."""
    text = re.sub(r":\w+:`~([^`]+)`", lambda m: "`" + m.group(1).split(".")[-1] + "`", text)
    text = re.sub(r":\w+:`([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _doc(model: Any) -> str:
    text = (model.__doc__ or "").strip()
    if not text or text.startswith(("Usage docs:", "A base class")):
        return ""
    return rst_to_markdown(" ".join(text.split("\n\n")[0].split()))


def schema_markdown(roots: Iterable[tuple[str, Any, str]]) -> list[str]:
    """Sections for ``roots`` ((title, model, intro)) and every schema they contain, each once
    (nested sections after the root that first names them)."""
    lines: list[str] = []
    done: set[Any] = set()
    roots = list(roots)
    owned = {model for _, model, _ in roots}  # each root schema in its own section
    for title, model, intro in roots:
        lines += [f"## {title}", "", intro, ""]
        queue = [model]
        while queue:
            current = queue.pop(0)
            if current in done or (current in owned and current is not model):
                continue
            done.add(current)
            found: list[Any] = []
            rows = schema_rows(current, found)
            lines += [f"### {current.__name__}", ""]
            doc = _doc(current)
            if doc:
                lines += [cell(doc), ""]
            lines += ["| key | type | default | range | description |", "|---|---|---|---|---|"]
            for key, tp, default, rng, desc in rows:
                lines.append(f"| `{key}` | {tp} | {default} | {cell(rng)} | {cell(desc)} |")
            lines.append("")
            queue += [m for m in found if m not in done]
    return lines


def config_roots() -> list[tuple[str, Any, str]]:
    """The schemas the configuration reference documents, with where each is used."""
    from asymvlm.data.embed import EmbedConfig
    from asymvlm.protocol import RunSpec
    from pipelines.schema import PipelineConfig, ServeConfig, SweepConfig
    from pipelines.schema.pipeline import EVALUATION_ITEMS

    evaluations = [
        (
            f"Evaluation `{kind}`",
            model,
            f"An item of the pipeline's `evaluations` list with `kind: {kind}` (the same "
            f"inputs as `asymvlm analyze {kind}`).",
        )
        for kind, model in EVALUATION_ITEMS.items()
    ]
    return [
        (
            "The pipeline",
            PipelineConfig,
            "`pipelines/full.py --config FILE.yaml` (`configs/*.yaml`); "
            "`--set key=value` overrides any key (dots and list indices: `sweeps.0.epochs=5`).",
        ),
        (
            "A sweep",
            SweepConfig,
            "`pipelines/sweep.py --config FILE.yaml` (`tune_spaces/*.yaml`) and each item of the "
            "pipeline's `sweeps`.",
        ),
        (
            "One training run",
            RunSpec,
            "A run of the protocol: `asymvlm train` and `pipelines/train.py` flags, and what every "
            "sweep trial runs.",
        ),
        (
            "An embedding job",
            EmbedConfig,
            "`asymvlm embed` flags, each of `pipelines/embed.py`'s jobs and the pipeline's "
            "`embed.jobs` (after `embed.defaults` are merged in).",
        ),
        *evaluations,
        ("Serve", ServeConfig, "`pipelines/serve.py --config FILE.yaml` and its flags."),
    ]


def config_page() -> str:
    """The configuration reference."""
    lines = [
        "# Configuration reference",
        "",
        "Generated from the pydantic schemas at every build of this site, so every key, "
        "type, default, range and description here is the one the code validates against. "
        "Unknown keys are refused with the closest known one named.",
        "",
    ]
    roots = config_roots()
    lines += ["| section | schema |", "|---|---|"]
    lines += [
        f"| [{cell(title)}](#{anchor(title)}) | `{model.__name__}` |" for title, model, _ in roots
    ]
    lines += [""] + schema_markdown(roots)
    return "\n".join(lines) + "\n"


def undocumented_fields() -> list[str]:
    """``Schema.key`` of every documented field without a description (should be none)."""
    found: list[Any] = []
    missing, seen = [], set()
    queue = [model for _, model, _ in config_roots()]
    while queue:
        model = queue.pop(0)
        if model in seen:
            continue
        seen.add(model)
        for key, _, _, _, desc in schema_rows(model, found):
            if not desc.strip():
                missing.append(f"{model.__name__}.{key}")
        queue += found
    return missing


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
    from asymvlm.results import DIRECTION_MEANINGS, METRIC_MEANINGS

    lines = ["| MLflow name | what it says |", "|---|---|"]
    for name, meaning in METRIC_MEANINGS.items():
        shown = f"`{name}`" if name == "rsum" else f"`t2i_{name}`, `i2t_{name}`"
        lines.append(f"| {shown} | {cell(meaning)} |")
    lines += ["", *(f"* **{d}**: {cell(m)}" for d, m in DIRECTION_MEANINGS.items())]
    return "\n".join(lines) + "\n"


def _copied(path: str, note: str) -> Callable[[], str]:
    def page() -> str:
        with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
            text = fh.read()
        title, _, rest = text.partition("\n")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the generated documentation pages.")
    parser.add_argument("output", help="folder to write them into")
    args = parser.parse_args(argv)
    for uri, make in PAGES.items():
        path = os.path.join(args.output, uri)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(make())
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
