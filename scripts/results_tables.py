"""The tables of today's figures on the results pages (docs/results/*.md), generated from one data file.

Every figure lives in ``docs/results/results.jsonl``, one JSON object a line: the ``page`` it is shown on
(``speed`` = docs/results/speed.md), the ``machine`` kind, the ``setting`` (dtype, sizes, ...), the benchmark's
``name`` and the figure's ``key`` and ``value`` as its ``RESULT`` line printed them, the ``commit`` measured and the
``command`` that printed it. Each page shows its figures as one table between the lines ``<!-- results:begin -->``
and ``<!-- results:end -->``, one row per machine, setting, benchmark and command. A new measurement replaces the
row of the same page, machine, setting, name and key, so the table is always the latest figure of each; the
history of a figure is the data file's history in git.

    python benchmarks/rollout.py ... | tee out.txt
    python scripts/results_tables.py add out.txt --page speed --machine "Intel Xeon ..., 2 vCPUs" \\
        --setting "bf16 (auto), 128 new tokens" --command "python benchmarks/rollout.py ..."   # --commit: HEAD
    python scripts/results_tables.py            # rewrite the pages' tables from the data file
    python scripts/results_tables.py --check    # exit 1 naming each page whose table is not the data file's

``add`` reads every ``RESULT name=... key=value ...`` line of the file (``-``: standard input); a value that is
not a number (``config=quickstart``) names the setting, not a figure. Words in parentheses after the pairs are
ignored. Figures of ``teamrl train`` runs (wall time, held-out accuracy) are written as a RESULT line by hand
from the run's output and ``eval_*.json`` (``RESULT name=quickstart wall_s=... accuracy_after=...``).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
DATA = RESULTS / "results.jsonl"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
FIELDS = ("page", "machine", "setting", "name", "key", "value", "commit", "command")
_PAIR = re.compile(r"([A-Za-z_][\w@./-]*)=(\S+)")


def parse_result(line: str) -> dict[str, str] | None:
    """The key=value pairs of a ``RESULT`` line (stopping at the first word that is not one), else None.

    >>> parse_result("RESULT name=rollout b32_ratio=2.76 b64_ratio=3.14 (3 reps)")
    {'name': 'rollout', 'b32_ratio': '2.76', 'b64_ratio': '3.14'}
    >>> parse_result("rollout done") is None
    True
    """
    words = line.strip().split()
    if not words or words[0] != "RESULT":
        return None
    pairs: dict[str, str] = {}
    for word in words[1:]:
        m = _PAIR.fullmatch(word)
        if m is None:
            break
        pairs[m.group(1)] = m.group(2).rstrip(",;")
    return pairs if "name" in pairs else None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def rows_of_result(pairs: dict[str, str], *, page: str, machine: str, setting: str, commit: str,
                   command: str) -> list[dict[str, str]]:
    """One row per numeric figure of a parsed RESULT line; its other pairs join the setting.

    >>> [(r["setting"], r["key"], r["value"]) for r in rows_of_result(
    ...     {"name": "update_packing", "config": "search", "ratio": "2.26"}, page="speed", machine="m",
    ...     setting="bf16", commit="abc1234", command="python benchmarks/update_packing.py")]
    [('bf16, config=search', 'ratio', '2.26')]
    """
    words = [f"{k}={v}" for k, v in pairs.items() if k != "name" and not _is_number(v)]
    full = ", ".join([s for s in (setting, *words) if s])
    return [dict(page=page, machine=machine, setting=full, name=pairs["name"], key=k, value=v, commit=commit,
                 command=command) for k, v in pairs.items() if k != "name" and _is_number(v)]


def load(path: Path = DATA) -> list[dict[str, str]]:
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            row = json.loads(line)
            missing = [f for f in FIELDS if not isinstance(row.get(f), str)]
            if missing:
                raise ValueError(f"{path.name} line {n}: missing or not text: {', '.join(missing)}")
            rows.append(row)
    return rows


def save(rows: list[dict[str, str]], path: Path = DATA) -> None:
    path.write_text("".join(json.dumps({f: r[f] for f in FIELDS}, ensure_ascii=False) + "\n" for r in rows),
                    encoding="utf-8")


def upsert(rows: list[dict[str, str]], new: list[dict[str, str]]) -> list[dict[str, str]]:
    """``rows`` with each new row replacing the one of the same page, machine, setting, name and key (in place;
    new figures are appended)."""
    ident = ("page", "machine", "setting", "name", "key")
    out = list(rows)
    for row in new:
        at = next((i for i, r in enumerate(out) if all(r[f] == row[f] for f in ident)), None)
        if at is None:
            out.append(row)
        else:
            out[at] = row
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|") if text else "-"


def table(rows: list[dict[str, str]], page: str) -> str:
    """The page's table: one line per machine, setting, benchmark, commit and command, in the data file's order."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for r in rows:
        if r["page"] == page:
            groups.setdefault((r["machine"], r["setting"], r["name"], r["commit"], r["command"]), []).append(
                f"{r['key']}={r['value']}")
    lines = ["| machine | setting | benchmark | figures | commit | command |", "| --- | --- | --- | --- | --- | --- |"]
    last_machine = None
    for (machine, setting, name, commit, command), figures in groups.items():
        shown = "〃" if machine == last_machine else machine
        last_machine = machine
        lines.append(f"| {_cell(shown)} | {_cell(setting)} | `{name}` | {'; '.join(figures)} | {_cell(commit)} | "
                     f"{'`' + command + '`' if command else '-'} |")
    return "\n".join(lines)


def render(text: str, rows: list[dict[str, str]], page: str) -> str:
    """``text`` (a page) with the part between its markers replaced by the page's table."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"docs/results/{page}.md needs one {BEGIN} line and one {END} line after it")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{table(rows, page)}\n{END}{tail}"


def pages(rows: list[dict[str, str]]) -> list[str]:
    return sorted({r["page"] for r in rows})


def stale_pages(rows: list[dict[str, str]], results: Path = RESULTS) -> list[str]:
    """The pages whose table is not what the data file gives."""
    return [p for p in pages(rows) if render((results / f"{p}.md").read_text(encoding="utf-8"), rows, p)
            != (results / f"{p}.md").read_text(encoding="utf-8")]


def write_pages(rows: list[dict[str, str]], results: Path = RESULTS) -> list[str]:
    changed = []
    for p in pages(rows):
        path = results / f"{p}.md"
        old = path.read_text(encoding="utf-8")
        new = render(old, rows, p)
        if new != old:
            path.write_text(new, encoding="utf-8")
            changed.append(p)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a page's table is not the data file's")
    parser.add_argument("--data", type=Path, default=DATA, help="the data file (default docs/results/results.jsonl)")
    sub = parser.add_subparsers(dest="cmd")
    add = sub.add_parser("add", help="add the figures of RESULT lines to the data file, then rewrite the pages")
    add.add_argument("output", help="a benchmark's output holding RESULT lines, or - for standard input")
    add.add_argument("--page", required=True, help="the results page (speed, quickstart, stability, ...)")
    add.add_argument("--machine", required=True, help="the machine kind, as lscpu names it (and idle or loaded)")
    add.add_argument("--setting", default="", help="dtype, sizes and other settings the RESULT line does not name")
    add.add_argument("--command", required=True, help="the command that printed the RESULT lines")
    add.add_argument("--commit", default=None, help="the commit measured (default: HEAD's short hash)")
    args = parser.parse_args(argv)
    results = args.data.parent
    rows = load(args.data)
    if args.cmd == "add":
        if not (results / f"{args.page}.md").is_file():
            parser.error(f"no page {results / (args.page + '.md')}")
        text = sys.stdin.read() if args.output == "-" else Path(args.output).read_text(encoding="utf-8")
        found = [p for p in map(parse_result, text.splitlines()) if p is not None]
        if not found:
            parser.error(f"no RESULT line in {args.output}")
        commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                                               capture_output=True, check=True).stdout.strip()
        new = [r for p in found for r in rows_of_result(p, page=args.page, machine=args.machine,
                                                          setting=args.setting, commit=commit, command=args.command)]
        rows = upsert(rows, new)
        save(rows, args.data)
        print(f"{len(new)} figure(s) of {len(found)} RESULT line(s) in {args.data.name}")
    if args.check:
        stale = stale_pages(rows, results)
        for p in stale:
            print(f"docs/results/{p}.md: its table is not {args.data.name}'s; run python scripts/results_tables.py",
                  file=sys.stderr)
        return 1 if stale else 0
    for p in write_pages(rows, results):
        print(f"rewrote the table of docs/results/{p}.md")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ValueError as err:  # a malformed data file or page: one line, no traceback
        sys.exit(f"results_tables.py: {err}")
