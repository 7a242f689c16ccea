"""The built-in configs that ship inside the package (``teamrl/configs/*.yaml``) and the recipes
(``teamrl/configs/recipes/*.yaml``, named ``recipes/NAME``: one per headline experiment of a paper, docs/recipes.md).

``teamrl train quickstart`` finds one by name; ``teamrl configs`` lists them and
``teamrl configs copy NAME [DEST]`` copies one out to edit.
"""

from __future__ import annotations

import os
import re
import shutil
from importlib import resources
from pathlib import Path

from teamrl.suggest import did_you_mean


def builtin_dir() -> Path:
    """The folder of the built-in configs inside the installed package."""
    return Path(str(resources.files("teamrl") / "configs"))


def builtin_names() -> list[str]:
    """Names of the built-in configs (file names without ``.yaml``, ``recipes/NAME`` for the recipes), sorted.

    >>> "quickstart" in builtin_names() and "recipes/drmas_math" in builtin_names()
    True
    """
    root = builtin_dir()
    return sorted(p.relative_to(root).with_suffix("").as_posix()
                  for pattern in ("*.yaml", "recipes/*.yaml") for p in root.glob(pattern))


def describe(name: str) -> str:
    """The first sentence of a built-in config's header comment (its lines joined, never cut mid-sentence).

    >>> describe("quickstart")
    'Quickstart: a solver and a verifier sharing SmolLM2-135M-Instruct, trained with the Dr. MAS estimator on synthetic arithmetic.'
    """
    words: list[str] = []
    for line in (builtin_dir() / f"{name}.yaml").read_text().splitlines():
        if not line.startswith("#") or line.startswith("#  "):  # the header ends, or a command line starts
            break
        words += line.lstrip("#").split()
        text = " ".join(words)
        end = re.search(r"[.!?](?=\s+[A-Z(]|$)", text.replace("Dr. ", "Dr_ "))
        if end is not None and end.end() < len(text) or (end is not None and text.endswith(".")):
            return text[: end.end()]
    return " ".join(words)


def resolve(config: str) -> str:
    """A config argument as a file path: an existing file as given, else a built-in config's name.

    Raises:
        FileNotFoundError: neither a file nor a built-in name (with the closest name).
    """
    if Path(config).exists():
        return config
    name = config.removeprefix("configs/").removesuffix(".yaml")  # a repository path: configs/recipes/x.yaml
    if name in builtin_names():
        return str(builtin_dir() / f"{name}.yaml")
    raise FileNotFoundError(f"config file {config!r} not found, and no built-in config has that name"
                            f"{did_you_mean(name, builtin_names())} (built-in: {', '.join(builtin_names())})")


def copy(name: str, dest: str | Path | None = None) -> Path:
    """Copy built-in config ``name`` to ``dest`` (a file, or a folder to put ``<name>.yaml`` in; default: here).

    Raises:
        FileNotFoundError: unknown name.
        FileExistsError: the target file exists (it is never overwritten).
    """
    if name not in builtin_names():
        raise FileNotFoundError(f"no built-in config {name!r}{did_you_mean(name, builtin_names())} "
                                f"(built-in: {', '.join(builtin_names())})")
    file = f"{Path(name).name}.yaml"  # recipes/drmas_math -> drmas_math.yaml
    target = Path(dest) if dest is not None else Path(file)
    if target.is_dir() or str(dest).endswith(("/", os.sep)):
        target = target / file
    if target.exists():
        raise FileExistsError(f"{target} exists; pick another destination (teamrl never overwrites it)")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(builtin_dir() / f"{name}.yaml", target)
    return target
