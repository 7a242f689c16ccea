"""Retrieval for search teams: corpus, BM25 index, HTTP service and client, QA data, answer metrics.

* :mod:`teamrl.search.index`: wiki-18-format corpora (``{"id", "contents": "\\"Title\\"\\ntext"}``)
  and a BM25 index over them (the ``bm25s`` library), built once and cached by the corpus's
  content hash.
* :mod:`teamrl.search.server`: ``teamrl serve-retriever``, an HTTP service (Starlette under
  uvicorn) speaking the Search-R1 retriever protocol (``POST /retrieve``, ``GET /health``).
* :mod:`teamrl.search.loadtest`: a bounded loopback load test of such a service.
* :mod:`teamrl.search.client`: the HTTP client (timeouts, bounded retries) and the in-process
  retriever with the same interface, plus how documents are shown to agents.
* :mod:`teamrl.search.corpus`: a corpus from HotpotQA distractor paragraphs (``teamrl build-corpus``).
* :mod:`teamrl.search.qa`: loaders for open-domain QA sets (NQ, HotpotQA, 2Wiki, MuSiQue, ...).
* :mod:`teamrl.search.metrics`: exact match, F1 and substring match over normalised answers.

Left out: dense (e5/FAISS) indexes; a server of that protocol can be used through its URL.
"""
