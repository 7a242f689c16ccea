"""The GPU check's bundle: every wheel teamrl needs beyond a bare GPU image, and a tokenizer, in one folder.

The GPU machines lent to this project have torch (CUDA), transformers, peft and pytest and no
network; whatever else is needed travels with the repository as an ignored folder of at most
64 MiB (``.gpu-bundle/``). :func:`prepare` runs here, with network (or a package index):

* ``wheels/``: ``pip download`` of teamrl's runtime dependencies (pyproject.toml), the ``lowbit``
  extra (torchao, for 8-bit AdamW states), minus what the image surely has (torch, transformers,
  peft, pytest and what they require directly, read from the installed packages' metadata here) and
  minus :data:`LEFT_OUT` (packages the check never imports), for manylinux x86_64 and Python
  3.10 to 3.13 (:data:`PYTHONS`);
* ``tokenizer/``: the embedded default model's tokenizer files (3.5 MB), so random-weight models of
  the real shapes get real prompts without the model's wheel (which is larger than the limit);
* ``manifest.json``: what is in it, and the size.

It fails, with the size, when the folder is over the limit. :func:`install` runs on the GPU machine:
it unpacks, for each project, the wheel that fits the running interpreter (``packaging.tags``) into
``site/`` (no pip, no index). It leaves out the embedded model's weights: items that need them
are skipped there.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

LIMIT_BYTES = 64 * 1024 * 1024
IMAGE = ("torch", "transformers", "peft", "pytest")
"""What the GPU image is known to have (with everything these require)."""
LEFT_OUT = {"scipy": "only teamrl report / ablate (Student-t intervals), 35 MB",
            "matplotlib": "only the PNG plots of teamrl report",
            "pillow": "tensorboard's image summaries only; teamrl writes scalars and text (7 MB per Python)",
            "grpcio": "tensorboard's server only; writing event files does not import it (7 MB per Python)"}
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
"""Python versions the bundle serves by default: the GPU image's is not known beforehand."""
EXTRAS = ("lowbit",)
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "config.json", "generation_config.json")


def norm(name: str) -> str:
    """A project name in its normal form (PEP 503).

    >>> norm("PyStemmer"), norm("typing_inspection"), norm("math.verify")
    ('pystemmer', 'typing-inspection', 'math-verify')
    """
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(reqs: list[str], extras: tuple[str, ...] = ()) -> list[str]:
    """Project names of requirement strings whose markers hold here (``extra`` markers: ``extras``).

    >>> requirement_names(["torch==2.13.0", "pydantic>=2.7", "ray; extra == 'ray'", "x; python_version < '3'"])
    ['torch', 'pydantic']
    """
    from packaging.requirements import Requirement

    out = []
    for text in reqs:
        r = Requirement(text)
        if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in (extras or ("",))):
            out.append(r.name)
    return out


def closure(roots: tuple[str, ...], depth: int = 1) -> set[str]:
    """``roots`` and the projects they require, ``depth`` levels down, from the installed packages' metadata.

    One level is what an image with ``roots`` surely has, whatever their versions there; deeper
    requirements change between versions (e.g. a newer ``typer``, required by ``transformers``,
    requires ``pydantic``; an older one does not), so they are brought along.
    """
    seen: set[str] = set()
    level = [norm(r) for r in roots]
    for _ in range(depth + 1):
        nxt = []
        for name in level:
            if name in seen:
                continue
            seen.add(name)
            try:
                nxt += [norm(n) for n in requirement_names(md.requires(name) or [])]
            except md.PackageNotFoundError:
                continue
        level = nxt
    return seen


def wanted(pyproject: Path) -> list[str]:
    """teamrl's runtime dependencies and :data:`EXTRAS`, minus the image's closure and :data:`LEFT_OUT`."""
    import tomllib  # Python 3.11+: prepare runs here, install on the GPU machine needs no tomllib

    project = tomllib.loads(pyproject.read_text())["project"]
    names = list(project["dependencies"])
    for extra in EXTRAS:
        names += project["optional-dependencies"][extra]
    absent = [n for n in IMAGE if not _installed(n)]
    if absent:
        raise ValueError(f"{', '.join(absent)} not installed in this Python ({sys.executable}): prepare reads what the "
                         f"GPU image has from the installed packages; run it with the project's environment "
                         f"(PYTHON=.venv/bin/python bash scripts/gpu_check.sh prepare)")
    have = closure(IMAGE)
    return sorted({norm(n) for n in requirement_names(names)} - have - {norm(k) for k in LEFT_OUT})


def _installed(name: str) -> bool:
    try:
        md.version(name)
    except md.PackageNotFoundError:
        return False
    return True


def folder_bytes(path: Path) -> int:
    """Total size of the files under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def check_size(total: int, limit: int = LIMIT_BYTES) -> None:
    """Raise when the bundle is over the limit, naming both sizes.

    >>> check_size(10 * 2**20)
    >>> check_size(70 * 2**20)
    Traceback (most recent call last):
    ...
    ValueError: the bundle is 70.0 MiB, over the 64.0 MiB a device call carries; leave out a package (LEFT_OUT) or a Python version
    """
    if total > limit:
        raise ValueError(f"the bundle is {total / 2**20:.1f} MiB, over the {limit / 2**20:.1f} MiB a device call "
                         f"carries; leave out a package (LEFT_OUT) or a Python version")


def prepare(out: Path, pythons: list[str], repo: Path, tokenizer: Path | None) -> dict[str, object]:
    """Fill ``out`` (wheels, tokenizer, manifest) and check its size; returns the manifest.

    Args:
        out: the bundle folder (emptied first).
        pythons: Python versions of the GPU machine, e.g. ``["3.11", "3.12"]``.
        repo: the repository root (its pyproject.toml).
        tokenizer: a folder with the default model's tokenizer files, or None to leave it out.

    Raises:
        ValueError: over :data:`LIMIT_BYTES`, or the image's packages are not installed here.
        subprocess.CalledProcessError: pip could not download a wheel.
    """
    names = wanted(repo / "pyproject.toml")
    if out.exists():
        shutil.rmtree(out)
    (out / "wheels").mkdir(parents=True)
    exclude = closure(IMAGE) | {norm(k) for k in LEFT_OUT}
    for py in pythons:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--implementation", "cp",
               "--python-version", py, "-d", str(out / "wheels"), *[f"--platform={p}" for p in PLATFORMS], *names]
        subprocess.run(cmd, check=True)
    for whl in (out / "wheels").glob("*.whl"):  # dependencies of the wanted ones that the image already has
        if norm(whl.name.split("-")[0]) in exclude:
            whl.unlink()
    if tokenizer is not None:
        (out / "tokenizer").mkdir()
        for f in TOKENIZER_FILES:
            if (tokenizer / f).is_file():
                shutil.copy2(tokenizer / f, out / "tokenizer" / f)
    total = folder_bytes(out)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    manifest = {"commit": commit, "pythons": pythons, "wanted": names, "left_out": LEFT_OUT, "image": list(IMAGE),
                "wheels": sorted(w.name for w in (out / "wheels").glob("*.whl")), "bytes": total,
                "tokenizer": tokenizer is not None}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    check_size(folder_bytes(out))
    return manifest


def pick_wheels(files: list[str], tags: list[str]) -> dict[str, str]:
    """For each project, the wheel file whose tags come first in ``tags`` (the interpreter's, best first).

    >>> pick_wheels(["a-1-cp311-cp311-manylinux_2_17_x86_64.whl", "a-1-cp312-cp312-manylinux_2_17_x86_64.whl",
    ...              "b-2-py3-none-any.whl"], ["cp312-cp312-manylinux_2_17_x86_64", "py3-none-any"])
    {'a': 'a-1-cp312-cp312-manylinux_2_17_x86_64.whl', 'b': 'b-2-py3-none-any.whl'}
    """
    from packaging.utils import parse_wheel_filename

    rank = {t: i for i, t in enumerate(tags)}
    best: dict[str, tuple[int, str]] = {}
    for f in files:
        name, _, _, wtags = parse_wheel_filename(f)
        score = min((rank[str(t)] for t in wtags if str(t) in rank), default=None)
        if score is not None and (name not in best or score < best[name][0]):
            best[name] = (score, f)
    return {n: f for n, (_, f) in sorted(best.items())}


def install(bundle: Path, site: Path) -> tuple[list[str], list[str]]:
    """Unpack the bundle's wheels that fit this interpreter into ``site`` (put it on ``PYTHONPATH``).

    Returns:
        (projects installed, projects with no wheel for this interpreter).
    """
    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename

    files = sorted(p.name for p in (bundle / "wheels").glob("*.whl"))
    chosen = pick_wheels(files, [str(t) for t in sys_tags()])
    site.mkdir(parents=True, exist_ok=True)
    for f in chosen.values():
        with zipfile.ZipFile(bundle / "wheels" / f) as z:
            z.extractall(site)
    every = {str(parse_wheel_filename(f)[0]) for f in files}
    return sorted(chosen), sorted(every - set(chosen))
