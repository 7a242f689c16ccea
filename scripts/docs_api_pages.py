"""The docs site's API reference, generated at build time (mkdocs-gen-files; mkdocs.yml runs it).

Walks the ``teamrl`` package as it is on disk, so a module that is added, moved or removed needs no edit here: one
page per module (``reference/teamrl/<path>.md`` holding mkdocstrings' ``::: teamrl.<path>``) and
``reference/SUMMARY.md``, the section's navigation (mkdocs-literate-nav)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "teamrl"


def modules() -> list[tuple[str, ...]]:
    """Dotted parts of each module and package under ``teamrl/``, sorted (packages before their modules)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts
        if "__pycache__" in parts or any(p.startswith("_") and p != "__init__" for p in parts):
            continue  # private modules are not the API
        if not all((ROOT.joinpath(*parts[:i]) / "__init__.py").is_file() for i in range(1, len(parts))):
            continue  # a folder of scripts or data files, not a package
        found.append(parts[:-1] if parts[-1] == "__init__" else parts)
    return sorted(set(found))


def main() -> None:
    import mkdocs_gen_files

    nav = mkdocs_gen_files.Nav()
    for parts in modules():
        page = Path(*parts).with_suffix(".md") if len(parts) > 1 else Path(parts[0], "index.md")
        if (PACKAGE.joinpath(*parts[1:]) / "__init__.py").is_file() and len(parts) > 1:
            page = Path(*parts, "index.md")
        nav[parts] = page.as_posix()
        with mkdocs_gen_files.open(Path("reference", page), "w") as f:
            f.write(f"::: {'.'.join(parts)}\n")
    with mkdocs_gen_files.open("reference/SUMMARY.md", "w") as f:
        f.writelines(nav.build_literate_nav())


if __name__ == "<run_path>":  # mkdocs-gen-files runs this file with runpy.run_path during a build
    main()
