"""The two-agent workload of ``benchmarks/rollout.py``: N solver -> verifier episodes sharing one model, run
through teamrl's Dispatcher or one ``model.generate`` call per agent per turn."""

from __future__ import annotations

import torch


def forget_prefixes(engine) -> None:
    """Empty the engine's store of prefilled prefixes: each timed call or rollout prefills its shared prefixes
    itself, as the first one after a weight update does (calls within it still reuse them)."""
    store = engine.prefix_store()
    if store is not None:
        store.clear()


SOLVER_SYS = "You are the solver. Solve the problem and end with 'Answer: <number>'."
VERIFIER_SYS = "You are the verifier. Reply 'yes' if the solution is correct, otherwise 'no'."


def team_prompts_solver(tok, problems: list[str]) -> list[list[int]]:
    chats = [[{"role": "system", "content": SOLVER_SYS}, {"role": "user", "content": p}] for p in problems]
    return [list(tok.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=False)) for c in chats]


def verifier_messages(problem: str, answer: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Problem: {problem}\nSolution: {answer}\nIs the solution correct?"}]


def team_teamrl(engine, tok, problems: list[str], solver_tokens: int, verifier_tokens: int, *,
                scheduler: str = "lockstep", ignore_eos: bool = True) -> int:
    """N solver -> verifier episodes through teamrl's Dispatcher; returns the number of generated tokens.

    ``ignore_eos`` forces every reply to its token budget (part 2); without it replies end naturally,
    so their lengths differ (part 3, where ``scheduler`` matters)."""
    from teamrl.engines.base import SamplingParams
    from teamrl.team.agents import Agent, Parsed
    from teamrl.team.records import Episode
    from teamrl.team.team import AgentBinding, Dispatcher, Team

    forget_prefixes(engine)

    def parse(text: str) -> Parsed:
        return Parsed(text, True)

    def binding(name: str, system: str, tokens: int) -> AgentBinding:
        sp = SamplingParams(max_new_tokens=tokens, ignore_eos=ignore_eos)
        return AgentBinding(Agent(name, system, parse), "main", sp, system)

    bindings = {"solver": binding("solver", SOLVER_SYS, solver_tokens),
                "verifier": binding("verifier", VERIFIER_SYS, verifier_tokens)}
    disp = Dispatcher({"main": engine}, schedulers={"main": scheduler})
    episodes = [Episode(prompt_index=i, index=0, problem_id=str(i)) for i in range(len(problems))]

    async def episode(ep: Episode, problem: str) -> None:
        team = Team(bindings, disp, ep)
        sol = await team.ask("solver", [{"role": "user", "content": problem}])
        await team.ask("verifier", verifier_messages(problem, sol.text))

    disp.run([episode(ep, p) for ep, p in zip(episodes, problems)])
    return sum(len(s.response_ids) for ep in episodes for s in ep.steps)


@torch.no_grad()
def team_sequential(model, tok, problems: list[str], solver_tokens: int, verifier_tokens: int) -> int:
    """The same episodes one after the other, one ``generate`` call per agent per turn."""
    n = 0
    for p in problems:
        ids = torch.tensor([team_prompts_solver(tok, [p])[0]], device=model.device)
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                             top_p=1.0, top_k=0, min_new_tokens=solver_tokens, max_new_tokens=solver_tokens,
                             pad_token_id=tok.pad_token_id, return_dict_in_generate=True, output_scores=True)
        sol_ids = out.sequences[0, ids.shape[1]:]
        n += sol_ids.numel()
        answer = tok.decode(sol_ids, skip_special_tokens=True)
        chat = [{"role": "system", "content": VERIFIER_SYS}, *verifier_messages(p, answer)]
        vids = torch.tensor([list(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True,
                                                          return_dict=False))], device=model.device)
        out = model.generate(input_ids=vids, attention_mask=torch.ones_like(vids), do_sample=True, temperature=1.0,
                             top_p=1.0, top_k=0, min_new_tokens=verifier_tokens, max_new_tokens=verifier_tokens,
                             pad_token_id=tok.pad_token_id, return_dict_in_generate=True, output_scores=True)
        n += out.sequences.shape[1] - vids.shape[1]
    return n
