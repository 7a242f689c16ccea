"""Continuous batching in the hf engine: requests joining a running batch, and the Dispatcher driving it."""

from __future__ import annotations

import pytest
import torch

from teamrl.engines.base import GenRequest, SamplingParams
from teamrl.engines.hf import HFEngine
from teamrl.engines.prefixes import PrefixStore, prefix_groups
from teamrl.team.agents import Agent, Parsed
from teamrl.team.records import Episode
from teamrl.team.team import AgentBinding, Dispatcher, Team
from tests.conftest import learner_logprob_gap, make_tiny_model


def _prompt(tok, text: str, system: str = "You are helpful.") -> list[int]:
    chat = [{"role": "system", "content": system}, {"role": "user", "content": text}]
    return list(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False))


def _same(a, b) -> None:
    assert a.response_ids == b.response_ids and a.finish_reason == b.finish_reason and a.text == b.text
    torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)


def _run_until(eng: HFEngine, outputs: dict, steps: int) -> None:
    for _ in range(steps):
        outputs.update(eng.step())


def test_request_joining_mid_flight_decodes_as_alone(tokenizer):
    """Greedy: a request added after others have decoded some steps gets the tokens and log-probs it gets alone,
    whether its prompt is shorter or longer than those already running."""
    model = make_tiny_model(tokenizer)
    greedy = SamplingParams(temperature=0, max_new_tokens=9, ignore_eos=True)
    first = [GenRequest(_prompt(tokenizer, "medium length question " * 2), greedy),
             GenRequest(_prompt(tokenizer, "q"), SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True))]
    late = [GenRequest(_prompt(tokenizer, "x"), greedy),  # shorter than every running prompt
            GenRequest(_prompt(tokenizer, "a much longer question about numbers and sheep " * 4), greedy)]
    alone = [HFEngine(model, tokenizer).generate([r])[0] for r in first + late]

    eng = HFEngine(model, tokenizer)
    outputs: dict = {}
    ids = eng.add(first)
    _run_until(eng, outputs, 3)  # both running, 3 tokens in
    ids += eng.add(late[:1])
    _run_until(eng, outputs, 2)  # the short request (4 tokens) finishes: its row is refilled by a move
    ids += eng.add(late[1:])
    while eng.busy:
        outputs.update(eng.step())
    for rid, want in zip(ids, alone, strict=True):
        _same(outputs[rid], want)


def test_more_requests_than_batch_rows_join_as_rows_finish(tokenizer):
    model = make_tiny_model(tokenizer)
    reqs = [GenRequest(_prompt(tokenizer, "y " * (5 * i + 1)),
                       SamplingParams(temperature=0, max_new_tokens=2 + (7 * i) % 9, ignore_eos=True)) for i in range(7)]
    ref = HFEngine(model, tokenizer, fast=False).generate(reqs)
    for out, want in zip(HFEngine(model, tokenizer, max_batch_size=2).generate(reqs), ref, strict=True):
        _same(out, want)


def test_sampled_request_is_independent_of_its_company(tokenizer):
    """A request's samples depend on the generator state when it was added, not on when it joined or with whom."""
    model = make_tiny_model(tokenizer)
    sp = SamplingParams(temperature=1.0, max_new_tokens=8, ignore_eos=True)
    target = GenRequest(_prompt(tokenizer, "sample me"), sp)
    alone = HFEngine(model, tokenizer, seed=7).generate([target])[0]

    eng = HFEngine(model, tokenizer, seed=7)
    (rid,) = eng.add([target])  # the same generator state as above when it is added
    outputs: dict = {}
    _run_until(eng, outputs, 2)
    eng.add([GenRequest(_prompt(tokenizer, "another, longer prompt " * 3), sp)])
    while eng.busy:
        outputs.update(eng.step())
    _same(outputs[rid], alone)


def test_joined_requests_logprobs_match_learner_recomputation(tokenizer):
    model = make_tiny_model(tokenizer)
    eng = HFEngine(model, tokenizer, seed=1, max_batch_size=3)
    reqs = [GenRequest(_prompt(tokenizer, f"question {i} " * (2 * i + 1)),
                       SamplingParams(temperature=0.7, top_p=0.9 if i % 2 else 1.0, max_new_tokens=3 + 2 * i))
            for i in range(6)]
    assert learner_logprob_gap(model, reqs, eng.generate(reqs)) <= 1e-3


def test_shared_prefix_prefill_gives_the_same_outputs(tokenizer):
    model = make_tiny_model(tokenizer)
    system = "You are the verifier of a long and detailed math problem about sheep. " * 3
    greedy = SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True)
    reqs = [GenRequest(_prompt(tokenizer, f"Solution {i}: " + "step " * i, system), greedy) for i in range(5)]
    reqs += [GenRequest(_prompt(tokenizer, "unrelated"), greedy), reqs[0]]  # a loner and a duplicate
    ref = HFEngine(model, tokenizer).generate(reqs)
    for out, want in zip(HFEngine(model, tokenizer, share_prefix=16).generate(reqs), ref, strict=True):
        _same(out, want)


@pytest.mark.parametrize("share_prefix", [0, 16])
def test_padded_prefill_runs_real_tokens_packed_with_the_same_outputs(tokenizer, monkeypatch, share_prefix):
    """Prompts of very different lengths (a fresh prefill, and with shared prefixes one that continues cached
    columns): the layers run the real tokens only, and the outputs equal the generic loop's."""
    from teamrl.engines import fast_decoder

    packed = []
    unpack = fast_decoder._unpack
    monkeypatch.setattr(fast_decoder, "_unpack", lambda *a: packed.append(a[0].shape[1]) or unpack(*a))
    model = make_tiny_model(tokenizer)
    system = "You check long and detailed solutions to math problems about sheep and goats. " * 2
    greedy = SamplingParams(temperature=0, max_new_tokens=5, ignore_eos=True)
    reqs = [GenRequest(_prompt(tokenizer, "word " * (1 + 9 * i), system), greedy) for i in range(5)]
    ref = HFEngine(model, tokenizer, fast=False).generate(reqs)
    for out, want in zip(HFEngine(model, tokenizer, share_prefix=share_prefix).generate(reqs), ref, strict=True):
        _same(out, want)
    lens = [len(r.prompt_ids) for r in reqs]
    assert packed and max(packed) < len(reqs) * (max(lens) - (min(lens) - 1 if share_prefix else 0))


def test_prefix_store_matches_the_longest_and_drops_the_least_recent():
    k = torch.zeros((2, 1, 6, 4))
    store = PrefixStore(3, max_tokens=10)
    store.put((1, 2, 3, 4, 5), k[:, :, :5], k[:, :, :5])
    store.put((1, 2, 3, 9), k[:, :, :4] + 1, k[:, :, :4] + 1)
    store.put((1, 2), k[:, :, :2], k[:, :, :2])  # shorter than the minimum: not stored
    assert store.match([1, 2, 3, 4, 7, 7], 6)[2] == 4
    kk, _, n = store.match([1, 2, 3, 9, 9], 4)
    assert n == 4 and bool((kk == 1).all())
    assert store.match([1, 2, 3, 4, 5, 6], 2)[2] == 0  # the limit is below the minimum
    assert store.match([1, 2, 7], 3)[2] == 0 and store.match([5, 5, 5], 3)[2] == 0
    assert store.hits == 2 and store.tokens_reused == 8
    store.put((7, 7, 7), k[:, :, :3], k[:, :, :3])  # 12 tokens > 10: the least recently used entry goes
    assert set(store.entries) == {(1, 2, 3, 9), (7, 7, 7)} and store.tokens == 7
    store.valid_for("weights 1")
    assert not store.entries and store.tokens == 0
    store.put((7, 7, 7), k[:, :, :3], k[:, :, :3])
    store.valid_for("weights 1")
    assert store.entries
    with pytest.raises(ValueError, match="min_len"):
        PrefixStore(0)


def test_prefix_store_reuses_prefixes_across_calls_and_forgets_them_after_an_update(tokenizer):
    """Later calls copy the system prompt (and a problem) prefilled by earlier ones: the same outputs as
    prefilling every prompt whole; after the weights change in place, nothing stale is reused."""
    model = make_tiny_model(tokenizer)
    system = "You are the verifier of a long and detailed math problem about sheep. " * 2
    greedy = SamplingParams(temperature=0, max_new_tokens=5, ignore_eos=True)

    def calls(i: int) -> list[GenRequest]:
        problem = f"Problem {i}: the farmer has {i} sheep and {i + 3} goats in the big field. "
        return [GenRequest(_prompt(tokenizer, problem + f"Solution {j}: " + "step " * j, system), greedy)
                for j in range(3)] + [GenRequest(_prompt(tokenizer, problem + "Is it right?", system), greedy)]

    shared, plain = HFEngine(model, tokenizer, share_prefix=16), HFEngine(model, tokenizer, share_prefix=0)
    for i in range(3):
        for out, want in zip(shared.generate(calls(i)), plain.generate(calls(i)), strict=True):
            _same(out, want)
    store = shared._prefix_store
    assert store is not None and store.hits >= 2 and store.entries
    reused = store.tokens_reused
    single = [GenRequest(_prompt(tokenizer, "A question of its own, asked once.", system), greedy)]
    _same(shared.generate(single)[0], plain.generate(single)[0])  # an ungrouped prompt starts from the store
    assert store.tokens_reused >= reused + 16
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.25)
    for out, want in zip(shared.generate(calls(1)), plain.generate(calls(1)), strict=True):
        _same(out, want)
    assert plain._prefix_store is None


def test_prefix_groups():
    # sorted: [1,2,3,4] [1,2,3,5] [1,2,9] [9,9]; common prefixes 3, 2, 0
    assert prefix_groups([[1, 2, 3, 4], [9, 9], [1, 2, 3, 5], [1, 2, 9]], 3) == [([0, 2], 3)]
    assert prefix_groups([[1, 2, 3, 4], [9, 9], [1, 2, 3, 5], [1, 2, 9]], 2) == [([0, 2, 3], 2)]
    assert prefix_groups([[1, 2], [1, 2, 3]], 1) == [([0, 1], 1)]  # stops one short of the shortest prompt


def _team_run(engine, scheduler: str, lengths: dict[int, tuple[int, int]]) -> tuple[list, list[str]]:
    """Episodes asking agent 'a' twice with the given reply lengths; returns their steps and the finish order."""
    agent = Agent("a", "sys", lambda t: Parsed(t, True))
    bindings = {"a": AgentBinding(agent, "m", SamplingParams(temperature=0, ignore_eos=True), "sys")}
    disp = Dispatcher({"m": engine}, schedulers={"m": scheduler})
    events: list[str] = []
    episodes = [Episode(prompt_index=0, index=i, problem_id="p") for i in lengths]

    async def run(ep: Episode) -> None:
        team = Team(bindings, disp, ep)
        first, second = lengths[ep.index]
        team.bindings = {"a": AgentBinding(agent, "m", SamplingParams(temperature=0, max_new_tokens=first,
                                                                        ignore_eos=True), "sys")}
        r = await team.ask("a", [{"role": "user", "content": f"episode {ep.index}"}])
        events.append(f"{ep.index}.1")
        team.bindings = {"a": AgentBinding(agent, "m", SamplingParams(temperature=0, max_new_tokens=second,
                                                                        ignore_eos=True), "sys")}
        await team.ask("a", [{"role": "user", "content": f"check: {r.text}"}])
        events.append(f"{ep.index}.2")

    disp.run([run(ep) for ep in episodes])
    return [[(s.response_ids, s.logprobs) for s in ep.steps] for ep in episodes], events


def test_dispatcher_continuous_lets_a_fast_episode_run_on(tokenizer):
    """Episode 0's short calls both finish while episode 1's long call is still decoding; lockstep makes
    episode 0's second call wait for it. Greedy outputs are the same under both schedulers."""
    model = make_tiny_model(tokenizer)
    lengths = {0: (2, 2), 1: (12, 2)}
    steps_c, order_c = _team_run(HFEngine(model, tokenizer), "continuous", lengths)
    steps_l, order_l = _team_run(HFEngine(model, tokenizer), "lockstep", lengths)
    assert order_c == ["0.1", "0.2", "1.1", "1.2"]
    assert order_l == ["0.1", "1.1", "0.2", "1.2"]
    for a, b in zip(steps_c, steps_l, strict=True):
        for (ta, la), (tb, lb) in zip(a, b, strict=True):
            assert ta == tb
            torch.testing.assert_close(torch.tensor(la), torch.tensor(lb), atol=1e-4, rtol=0)


@pytest.mark.parametrize("scheduler", ["continuous", "lockstep"])
def test_dispatcher_with_generic_engine_and_engine_errors(tokenizer, scheduler):
    model = make_tiny_model(tokenizer)
    lengths = {0: (2, 3), 1: (5, 1)}
    generic, _ = _team_run(HFEngine(model, tokenizer, fast=False), "continuous", lengths)
    fast, _ = _team_run(HFEngine(model, tokenizer), "continuous", lengths)
    assert [[t for t, _ in ep] for ep in generic] == [[t for t, _ in ep] for ep in fast]

    class Broken(HFEngine):
        def step(self):
            raise RuntimeError("out of memory")

    broken = Broken(model, tokenizer)
    agent = Agent("a", "sys", lambda t: Parsed(t, True))
    disp = Dispatcher({"m": broken}, schedulers={"m": scheduler})
    bindings = {"a": AgentBinding(agent, "m", SamplingParams(max_new_tokens=2), "sys")}

    async def run(i: int) -> str:
        try:
            await Team(bindings, disp, Episode(prompt_index=0, index=i, problem_id="p")).ask("a", [{"role": "user", "content": "q"}])
        except RuntimeError as exc:
            return str(exc)
        return "no error"

    assert disp.run([run(0), run(1)]) == ["out of memory"] * 2
    assert not broken.busy


def test_share_prefix_without_the_fast_loop_warns(tokenizer, caplog):
    with caplog.at_level("WARNING", logger="teamrl.engines.hf"):
        HFEngine(make_tiny_model(tokenizer), tokenizer, fast=False, share_prefix=16)
    assert "share_prefix=16 has no effect" in caplog.text
