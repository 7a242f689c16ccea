"""MAD-OPD's debate among teachers (arXiv 2605.01347; chiefovoavicii/MAD-OPD at 6c7a66a): its prompts, the
confidence tags and the weights they give, as pure functions of text.

For each trained reply, two teachers debate its prompt ``p`` without seeing the reply ("blind",
``batch_blind_mad_debate_and_force_decode``, ``mad_opd/trainers/vllm_teacher_manager.py:786-1087``): in round 1 each
answers :func:`first_round_prompt` alone; in rounds 2..R each answers :func:`revision_prompt`, which holds the debate
so far. The last round's ``<<CONFIDENCE=N>>`` tags give the teachers' weights (:func:`confidence_weights`, Eq. 7), and
each teacher then scores the student's reply after :func:`teacher_context` (the prompt, its identity and the debate
transcript :func:`debate_history`) wrapped by the chat template as a user turn. The prompt texts are the original's
character for character, for its three modes (``general``: math and reasoning; ``code``; ``tool``: ToolACE).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

__all__ = ["CONFIDENCE_SUFFIX", "MODES", "confidence_weights", "debate_history", "first_round_prompt",
           "last_confidence", "revision_prompt", "teacher_context"]

MODES = ("general", "code", "tool")

CONFIDENCE_SUFFIX = ("\n\nIMPORTANT: At the very end of your response, output your confidence "
                     "using EXACTLY this format: <<CONFIDENCE=N>> where N is an integer from 0 to 100. "
                     "Do not include any other text after this tag.")
"""Appended to every debate prompt when the weights come from the teachers' confidences (:847-851)."""

EXPERTS = ("A", "B")


def first_round_prompt(prompt: str, mode: str = "general", suffix: str = CONFIDENCE_SUFFIX) -> str:
    """Round 1: each teacher answers the prompt alone (:854-874)."""
    if mode == "tool":
        return (f"You are an expert in AI tool-use and function calling. "
                f"Please analyze the following user request and provide the best tool-use response.\n\n"
                f"User request: {prompt}\n\nYour response:{suffix}")
    if mode == "code":
        return (f"You are an expert programmer specializing in competitive programming and code golf. "
                f"Please solve the following programming challenge. "
                f"Focus on algorithm correctness, edge case handling, and code efficiency.\n\n"
                f"Problem:\n{prompt}\n\nYour code solution:{suffix}")
    return (f"You are a knowledgeable expert. Please solve the following problem step by step.\n\n"
            f"Question: {prompt}\n\nYour solution:{suffix}")


def revision_prompt(prompt: str, history: str, expert: str, mode: str = "general",
                    suffix: str = CONFIDENCE_SUFFIX) -> str:
    """Rounds 2..R: expert ``expert`` ("A" or "B") revises after the debate so far, ``history`` being its parts
    joined by newlines (:893-963). The general mode's missing spaces after "solution." and "problem." are the
    original's."""
    if mode == "tool":
        return (f"{prompt}\n\n"
                f"The following is the debate history between two experts on this request:\n\n"
                f"{history}\n\n"
                f"You are Expert {expert}. You don't have to agree with the other expert's response. "
                f"Please continue the debate about the best tool-use strategy. "
                f"Having seen the debate history, please reconsider and provide your "
                f"improved response focusing on tool selection accuracy, parameter correctness, "
                f"and call sequence optimization.{suffix}")
    if mode == "code":
        return (f"{prompt}\n\n"
                f"The following is the debate history between two expert programmers on this challenge:\n\n"
                f"{history}\n\n"
                f"You are Expert {expert}. You don't have to agree with the other expert's solution. "
                f"Please continue the debate about the best approach. "
                f"Having seen the debate history, please reconsider and provide your "
                f"improved solution focusing on algorithm correctness, edge case handling, "
                f"time/space complexity, and code conciseness.{suffix}")
    return (f"{prompt}\n\n"
            f"The following is the debate history between two experts on this problem:\n\n"
            f"{history}\n\n"
            f"You are Expert {expert}, you don't have to agree with the other expert's solution."
            f"please continue the debate about this problem."
            f"Having seen the debate history, please reconsider and provide your "
            f"response with improved reasoning.{suffix}")


def debate_part(expert: str, round_: int, text: str) -> str:
    """One answer as the transcript holds it (:884-885, :971-972)."""
    return f"[Expert {expert} Round {round_}]: {text}"


def debate_history(parts: Sequence[str]) -> str:
    """The final transcript H of a debate's parts (:1000-1002).

    >>> debate_history([debate_part("A", 1, "4"), debate_part("B", 1, "5")])
    '[Debate Start]\\n[Expert A Round 1]: 4\\n[Expert B Round 1]: 5\\n[Debate End]'
    """
    return "[Debate Start]\n" + "\n".join(parts) + "\n[Debate End]"


def teacher_context(prompt: str, history: str, expert: str, mode: str = "general") -> str:
    """What teacher ``expert`` reads before the student's reply, as a user turn (:1038-1070)."""
    head = (f"{prompt}\n\n"
            f"You are Expert {expert}. The following is the debate between you and other experts:\n\n"
            f"{history}\n\n")
    if mode == "tool":
        return head + "Now based on the debate, provide the best tool-use response:"
    if mode == "code":
        return head + "Now based on the debate results, please write the best code solution to this programming challenge:"
    return head + "Now based on the debate results, please solve this problem again using your own method and process:"


def last_confidence(text: str) -> float:
    """The last ``<<CONFIDENCE=N>>`` tag's N, or -1 without one (``_extract_last_confidence``, :1098-1107).

    >>> last_confidence("x <<CONFIDENCE=40>> then <<CONFIDENCE=85>>"), last_confidence("confidence: 90")
    (85.0, -1)
    """
    scores = re.findall(r"<<CONFIDENCE=(\d+)>>", text)
    return float(scores[-1]) if scores else -1


def confidence_weights(score_a: float, score_b: float, tau: float = 1.0) -> tuple[float, float]:
    """Eq. 7, ``w_k = softmax(c_k / 100 / tau)`` of the last round's two confidences (``_softmax_confidence_weights``,
    ``mad_opd/trainers/mad_opd_core.py:31-38``); (0.5, 0.5) when either teacher gave none (:1011-1017).

    >>> [round(w, 4) for w in confidence_weights(90, 40)]
    [0.6225, 0.3775]
    >>> confidence_weights(90, -1)
    (0.5, 0.5)
    """
    if score_a < 0 or score_b < 0:
        return 0.5, 0.5
    logits = [score_a / 100.0 / tau, score_b / 100.0 / tau]
    m = max(logits)
    exps = [math.exp(x - m) for x in logits]
    z = sum(exps)
    return exps[0] / z, exps[1] / z
