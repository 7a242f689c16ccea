"""The search team: a router, a searcher and an answerer answering a question with a search engine.

The search orchestra of Dr. MAS (arXiv 2602.08847). Each turn:

1. the **router** reads the question and everything found so far and replies yes (enough to
   answer) or no (search more); its reply is read like the math verifier's (``verdict_parse``);
2. on no, the **searcher** writes one query in ``<search>...</search>``; the task's retriever
   runs it and the documents join the team's shared history as
   ``<information>Doc 1 (Title: ...) text ...</information>``;
3. on yes, the **answerer** replies with ``<answer>...</answer>`` and the episode ends.

With ``prefill_tags`` the searcher's and answerer's replies start with their opening tag and end
at the closing one (or at the model's end of turn), so a small model only has to write the query
or the answer.

After ``max_turns`` turns without an answer the team's answer is empty (it scores 0), unless
``force_answer`` makes the last turn go straight to the answerer. A malformed reply (no tags,
nested or repeated tags, an empty query, a query over ``max_query_chars``) is an invalid step,
which the trainer's format penalty hits; an over-long query still runs, cut to
``max_query_chars``; any other malformed query runs no search and uses up its turn. Dr. MAS's orchestra runs two
rules of its own, as options: no search on the last turn (``search_last_turn: false``) and an answer without a
readable answer continuing the episode (``end_on_malformed_answer: false``).

Each episode records ``info["turns"]``, ``info["searches"]`` and ``info["answered"]``.

Left out: several queries per turn, and rewriting the history (every document found stays).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from teamrl.domains.search.index import Doc, doc_from_row
from teamrl.domains.search.tags import extract_tag
from teamrl.tasks.base import Problem, Task
from teamrl.team.agents import Parsed, register_agent
from teamrl.team.registry import register_workflow
from teamrl.team.team import Team
from teamrl.team.workflows import parse_verdict

__all__ = ["SearchTeamConfig", "format_information", "parse_answer", "parse_search", "search_team"]

DEFAULT_MAX_QUERY_CHARS = 200

_ROUTER_ASK = "Is the information above enough to answer the question? Reply yes or no."
_SEARCH_ASK = ("Write one short search query for the fact that is still missing, inside <search> and </search>: "
               "a few key words, such as the names in the question.")


def parse_search(text: str, *, max_chars: int = DEFAULT_MAX_QUERY_CHARS) -> Parsed:
    """The searcher's query: the single ``<search>`` span, whitespace collapsed.

    Over ``max_chars`` it is cut to that length and the step is invalid; a malformed reply gives
    ``Parsed(None, False)``.

    >>> parse_search("<search>  Eiffel\\n tower height </search>")
    Parsed(value='Eiffel tower height', valid=True)
    >>> parse_search("<search>abcdef</search>", max_chars=3)
    Parsed(value='abc', valid=False)
    >>> parse_search("<search></search>")
    Parsed(value=None, valid=False)
    """
    content = extract_tag(text, "search").content
    if content is None:
        return Parsed(None, valid=False)
    query = " ".join(content.split())
    if len(query) > max_chars:
        return Parsed(query[:max_chars].rstrip(), valid=False)
    return Parsed(query, valid=True)


def parse_answer(text: str) -> Parsed:
    """The answerer's answer: the single ``<answer>`` span, or ``Parsed(None, False)``."""
    content = extract_tag(text, "answer").content
    return Parsed(content, valid=content is not None)


@register_agent("router", system_prompt=(
    "You lead a small research team that answers questions with a search engine. You read the "
    "question and the information the team has found so far, and decide whether it is enough to "
    "answer. Reply yes if it is enough, or no if the team should search more."))
def _parse_route(text: str) -> Parsed:
    return parse_verdict(text, mode="lenient")


@register_agent("searcher", system_prompt=(
    "You write queries for a search engine over Wikipedia. You read a question and the information "
    "found so far, and write one short query for the fact that is still missing, inside <search> and "
    "</search>."))
def _parse_query(text: str) -> Parsed:
    return parse_search(text)


@register_agent("answerer", system_prompt=(
    "You answer questions using the information a research team has found. Give the final answer as "
    "a short phrase inside <answer> and </answer>."))
def _parse_final(text: str) -> Parsed:
    return parse_answer(text)


@dataclass(kw_only=True)
class SearchTeamConfig:
    max_turns: int = 4
    """Most turns; a turn is one router verdict followed by one search or by the answer."""
    force_answer: bool = False
    """Whether the last turn skips the router and asks the answerer. false (Dr. MAS): a team that has not answered after max_turns turns gives an empty answer, which scores 0."""
    verdict_parse: Literal["strict", "lenient"] = "lenient"
    """How the router's reply is read. strict: the first word must be yes or no. lenient: the last yes/no word anywhere. A reply with neither is an invalid step."""
    on_invalid_verdict: Literal["search", "answer"] = "search"
    """What an unreadable router reply does: search (ask the searcher) or answer (ask the answerer)."""
    search_last_turn: bool = True
    """Whether the searcher runs on the last turn. false (Dr. MAS's search orchestra): a router's no on the last turn ends the episode unanswered, as a search there could never be read."""
    end_on_malformed_answer: bool = True
    """Whether an answerer reply without a readable answer ends the episode (with that reply as the team's answer). false (Dr. MAS: such a reply is an empty action and the episode goes on): it is an invalid step and the next turn starts, with the router again."""
    max_query_chars: int = DEFAULT_MAX_QUERY_CHARS
    """Longest query run as is; a longer one is cut to this length and its step is invalid."""
    max_doc_chars: int = 0
    """Cut each retrieved document's text to this many characters in the prompts (0 = whole documents)."""
    prefill_tags: bool = False
    """Start the searcher's reply with <search> and the answerer's with <answer> (prompt tokens, not trained on); the reply ends at the closing tag, and a reply the model ends itself (end-of-turn) is closed for it, so the model writes only the query or the answer. A reply cut by max_new_tokens stays malformed. false: the model writes the tags itself (Search-R1's setting). Small models rarely write the tags unprompted."""

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns {self.max_turns} must be >= 1")
        if self.max_query_chars < 1:
            raise ValueError(f"max_query_chars {self.max_query_chars} must be >= 1")
        if self.max_doc_chars < 0:
            raise ValueError(f"max_doc_chars {self.max_doc_chars} must be >= 0 (0 = whole documents)")


def _as_doc(doc: Doc | Mapping[str, Any]) -> Doc:
    return doc if isinstance(doc, Doc) else doc_from_row(dict(doc), "retrieved document")


def format_information(docs: list[Doc | Mapping[str, Any]], max_chars: int = 0) -> str:
    """Documents as the team sees them.

    >>> format_information([Doc("1", '"Paris"\\nParis is the capital of France.')], max_chars=12)
    '<information>Doc 1 (Title: Paris) Paris is the...</information>'
    """
    lines = []
    for i, doc in enumerate(map(_as_doc, docs), start=1):
        text = doc.text
        if max_chars and len(text) > max_chars:
            text = text[:max_chars].rstrip() + "..."
        lines.append(f"Doc {i} (Title: {doc.title}) {text}")
    return "<information>" + "\n".join(lines) + "</information>"


def _searcher_of(task: Task) -> Callable[[list[str]], Awaitable[list[list[Any]]]]:
    """The task's ``retrieve`` as a coroutine function (a blocking one runs in a worker thread)."""
    retrieve = getattr(task, "retrieve", None)
    if not callable(retrieve):
        raise ValueError(f"workflow search_team needs a task that can search; task {task.name!r} has no "
                         "retrieve(queries) method (use task.name=search)")
    if inspect.iscoroutinefunction(retrieve):
        searcher: Callable[[list[str]], Awaitable[list[list[Any]]]] = retrieve
        return searcher

    async def in_thread(queries: list[str]) -> list[list[Any]]:
        return await asyncio.to_thread(retrieve, queries)

    return in_thread


def _ask(context: str, request: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{context}\n\n{request}"}]


@register_workflow("search_team", config=SearchTeamConfig, agents=("router", "searcher", "answerer"),
                   calls=lambda o, t: o.max_turns)
async def search_team(team: Team, problem: Problem, task: Task, cfg: SearchTeamConfig) -> str | None:
    """Router decides, searcher searches, answerer answers (Dr. MAS search team)."""
    search = _searcher_of(task)
    route = functools.partial(parse_verdict, mode=cfg.verdict_parse)
    query_of = functools.partial(parse_search, max_chars=cfg.max_query_chars)

    def answer_of(text: str) -> Parsed:
        return Parsed(text, valid=task.extract_answer(text) is not None)

    search_tags = ("<search>", "</search>") if cfg.prefill_tags else ("", "")
    answer_tags = ("<answer>", "</answer>") if cfg.prefill_tags else ("", "")
    invalid_goes_to_answer = cfg.on_invalid_verdict == "answer"
    forced_turn = cfg.max_turns - 1 if cfg.force_answer else -1
    history: list[str] = []
    answer: str | None = None
    searches = 0
    for turn in range(cfg.max_turns):
        context = f"Question: {problem.question}\n\n" + ("\n\n".join(history) or "Nothing has been searched yet.")
        if turn == forced_turn:
            to_answer = True
        else:
            verdict = await team.ask("router", _ask(context, _ROUTER_ASK), parse=route)
            to_answer = verdict.value == "approve" if verdict.valid else invalid_goes_to_answer
        if to_answer:
            # the question again, right before the request: small models lose it behind the documents
            request = f"Question: {problem.question}\n{task.answer_format}"
            reply = await team.ask("answerer", _ask(context, request), parse=answer_of,
                                    prefix=answer_tags[0], close=answer_tags[1])
            if reply.valid or cfg.end_on_malformed_answer:
                answer = reply.text
                break
            continue
        if turn == cfg.max_turns - 1 and not cfg.search_last_turn:
            break
        query = await team.ask("searcher", _ask(context, _SEARCH_ASK), parse=query_of,
                               prefix=search_tags[0], close=search_tags[1])
        if query.value is not None:
            [docs] = await search([query.value])
            searches += 1
            history.append(f"Search {searches}: {query.value}\n{format_information(docs, cfg.max_doc_chars)}")
    team.episode.info.update(turns=turn + 1, searches=searches, answered=answer is not None)
    return answer
