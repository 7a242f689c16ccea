"""Search: open-domain questions answered with a search engine.

* :mod:`.search`: the task ``search``; :mod:`.search_team`: the workflow ``search_team`` (router, searcher, answerer).

Retrieval for search teams: corpus, BM25 index, HTTP service and client, QA data, answer metrics.

* :mod:`teamrl.domains.search.index`: wiki-18-format corpora (``{"id", "contents": "\\"Title\\"\\ntext"}``)
  and a BM25 index over them (the ``bm25s`` library), built once and cached by the corpus's
  content hash.
* :mod:`teamrl.domains.search.server`: ``teamrl serve-retriever``, an HTTP service (Starlette under
  uvicorn) speaking the Search-R1 retriever protocol (``POST /retrieve``, ``GET /health``).
* :mod:`teamrl.domains.search.loadtest`: a bounded loopback load test of such a service.
* :mod:`teamrl.domains.search.client`: the HTTP client (timeouts, bounded retries) and the in-process
  retriever with the same interface, plus how documents are shown to agents.
* :mod:`teamrl.domains.search.corpus`: a corpus from HotpotQA distractor paragraphs (``teamrl build-corpus``).
* :mod:`teamrl.domains.search.qa`: loaders for open-domain QA sets (NQ, HotpotQA, 2Wiki, MuSiQue, ...).
* :mod:`teamrl.domains.search.metrics`: exact match, F1 and substring match over normalised answers.

Left out: dense (e5/FAISS) indexes; a server of that protocol can be used through its URL.
"""

TASKS: tuple[str, ...] = ("search",)
"""Modules that register this domain's tasks (imported on first lookup)."""
WORKFLOWS: tuple[str, ...] = ("search_team",)
"""Modules that register this domain's workflows."""
