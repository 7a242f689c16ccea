"""Each recipe's manifest of sources: for every value it sets, the teamrl key, the value the config resolves to, what
the original sets there and the original's file:line at the recipe's commit.

    python scripts/recipe_sources.py            # write configs/recipes/sources/<name>.yaml for every recipe
    python scripts/recipe_sources.py --check    # exit 1 naming every recipe whose manifest differs from it

The manifest is made from the recipe itself: each value's trailing comment is what the original sets (its text) and
where (every FILE:LINE it names; FILE:LINE-LINE for a range, :LINE for another line of the file named before it). A
value whose comment says the original does not set it has no location. ``tests/recipes/test_sources.py`` checks the
manifests against the recipes as resolved, so a recipe cannot drift from its manifest.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
RECIPES = REPO / "configs" / "recipes"
SOURCES = RECIPES / "sources"
LOCATION = re.compile(r"(?:[\w./-]+\.(?:sh|yaml|py|md|json)|):\d+(?:-\d+)?")
ORIGINAL = re.compile(r"([\w.-]+/[\w.-]+) @ ([0-9a-f]{40})")


def recipe_values(text: str) -> list[tuple[str, str]]:
    """(dotted key, trailing comment) of every value a recipe's YAML sets, in file order.

    >>> recipe_values("a:\\n  b: 1   # x.sh:3 b=1\\n  c:\\n    d: [1, 2]  # y.py:4\\ne: 2  # not set\\n")
    [('a.b', 'x.sh:3 b=1'), ('a.c.d', 'y.py:4'), ('e', 'not set')]
    """
    out, stack = [], []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        body, _, comment = line.partition("  #")
        key, _, value = body.strip().partition(":")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if not value.strip():
            stack.append((indent, key.strip()))
            continue
        out.append((".".join([k for _, k in stack] + [key.strip()]), comment.strip()))
    return out


def locations(comment: str) -> list[str]:
    """The FILE:LINE locations a comment names, a bare :LINE completed with the file before it.

    >>> locations("run_math.sh:36 actor_optim_lr[0], :57; eval.yaml:80-82")
    ['run_math.sh:36', 'run_math.sh:57', 'eval.yaml:80-82']
    """
    found, last = [], ""
    for m in LOCATION.finditer(comment):
        loc = m.group()
        if loc.startswith(":"):
            if not last:
                continue
            loc = last + loc
        last = loc.split(":")[0]
        found.append(loc)
    return found


def resolved(name: str) -> dict[str, Any]:
    from teamrl.config import tools as configtools
    from teamrl.config.schema import load_config

    return configtools.to_dict(load_config(str(RECIPES / f"{name}.yaml"), []))


def lookup(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        node = node[part]
    return node


def manifest(name: str) -> dict[str, Any]:
    """The manifest of ``recipes/<name>`` (module docstring)."""
    text = (RECIPES / f"{name}.yaml").read_text()
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    cfg = resolved(name)
    values = []
    for key, comment in recipe_values(text):
        at = locations(comment)
        values.append({"key": key, "teamrl": lookup(cfg, key), "original": comment or None, "at": at})
    return {"recipe": f"recipes/{name}",
            "originals": [{"repo": r, "commit": c} for r, c in ORIGINAL.findall(header)],
            "values": values}


def dump(m: dict[str, Any]) -> str:
    head = (f"# The sources of {m['recipe']}, made from the recipe by scripts/recipe_sources.py and checked against it\n"
            f"# by tests/recipes/test_sources.py: key (teamrl), teamrl (the value the config resolves to), original (what\n"
            f"# the original sets, as the recipe's comment says), at (its file:line at the commit).\n")
    return head + yaml.safe_dump(m, sort_keys=False, allow_unicode=True, width=120)


def names() -> list[str]:
    return sorted(p.stem for p in RECIPES.glob("*.yaml"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare instead of writing")
    args = p.parse_args(argv)
    stale = []
    for name in names():
        text, path = dump(manifest(name)), SOURCES / f"{name}.yaml"
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
            continue
        SOURCES.mkdir(exist_ok=True)
        path.write_text(text)
    if stale:
        print(f"manifests differ from their recipes: {', '.join(stale)}; run python scripts/recipe_sources.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
