"""Samples by reference (common/sharding.py): the coordinator puts one shard per learner rank
and hands over their references with the batch's metadata; the driver counts from the
metadata and, only when recording rollouts, puts the batch back in order from the shards."""
import pickle

import pytest

from cluster.records.metrics import GeneratorActivity, step_metrics
from common.sharding import Shards, make_shards, shard_members, shard_samples
from common.types import PromptRecord, TrainBatch, TrainSample


def sample(prompt_len: int, resp_len: int, version: int) -> TrainSample:
    return TrainSample(list(range(1, prompt_len + 1)), list(range(resp_len)),
                       [-0.5] * resp_len, 0.25, version)


SAMPLES = [sample(3, r, v) for r, v in [(9, 4), (2, 5), (7, 5), (1, 3), (5, 5), (3, 4)]]


def test_the_shards_are_the_balanced_split_and_put_back_in_order():
    stored = {}

    def put(shard):  # an object store: a key per shard, the contents kept aside
        stored[len(stored)] = shard
        return len(stored) - 1

    sh = make_shards(SAMPLES, 2, put)
    assert [stored[r] for r in sh.refs] == shard_samples(SAMPLES, 2)
    assert sh.members == shard_members(SAMPLES, 2)
    assert sorted(i for m in sh.members for i in m) == list(range(len(SAMPLES)))
    assert sh.versions == [4, 5, 5, 3, 5, 4]
    assert sh.tokens == [12, 5, 10, 4, 8, 6]
    assert sh.ordered([stored[r] for r in sh.refs]) == SAMPLES
    with pytest.raises(ValueError, match="shard holds 1 samples"):
        sh.ordered([stored[sh.refs[0]][:1], stored[sh.refs[1]]])
    with pytest.raises(ValueError, match="cannot feed 7 learner ranks"):
        make_shards(SAMPLES, 7, put)


def test_the_driver_counts_a_batch_by_reference_as_it_counts_one_inline():
    """metrics.jsonl's sample figures are the same from the metadata as from the samples, and
    the batch the driver receives carries none of the samples' tokens."""
    from common.records import StepResult
    from cluster.records.metrics import StepTimes, Tally

    inline = TrainBatch(records=[], samples=list(SAMPLES), version=5, inflight_prompts=0)
    by_ref = TrainBatch(records=[], samples=[], version=5, inflight_prompts=0,
                        shards=make_shards(SAMPLES, 3, lambda s: object()))
    assert by_ref.sample_versions() == inline.sample_versions()
    assert by_ref.sample_tokens() == inline.sample_tokens()
    result = StepResult(loss=0.1, grad_norm=1.0)
    t = StepTimes(0.0, 1.0, 2.0, 3.0, 4.0)
    a, b = (step_metrics(1, 5, x, result, t, GeneratorActivity(), 4, (-1.0, 1.0), Tally(),
                         None)
            for x in (inline, by_ref))
    assert (a.trained_samples, a.trained_tokens, a.staleness_mean, a.staleness_max) == \
        (b.trained_samples, b.trained_tokens, b.staleness_mean, b.staleness_max)
    assert (a.trained_samples, a.trained_tokens, a.staleness_max) == (6, 45, 2)
    # what crosses the driver: 6 samples inline, only their per-sample counts by reference
    refs = TrainBatch(records=[], samples=[], version=5, inflight_prompts=0,
                      shards=Shards([None] * 3, by_ref.shards.members, by_ref.shards.versions,
                                    by_ref.shards.tokens))
    assert len(pickle.dumps(refs)) < len(pickle.dumps(inline))


def record(uid: str, prompt_id: str, rewards: list[float], trained: int | None) -> PromptRecord:
    k = len(rewards)
    return PromptRecord(
        prompt_id=prompt_id, uid=uid, prompt="1+1=", k=k, rewards=rewards, baseline=0.0,
        prior_p=0.5, prior_accepted=False, fallback=False, unparsed=0, admitted_version=0,
        deadline=0, versions=[0], generators=[0], rounds=1, cancelled_rollouts=0,
        cancelled_tokens=0, regenerations=0, tokens=k, lengths=[1] * k, prompt_tokens=1,
        t_admit=0.0, t_done=0.0, spans=[], trained_samples=trained)


def test_recorded_rollouts_come_back_in_order_with_a_trimmed_prompts_samples(tmp_path):
    """rollouts.msgpack from a batch by reference: every prompt's trained samples, in order
    (a prompt the batch trimmed has fewer than its k: the recorder once took k)."""
    from cluster.records.files import RunFiles
    from learner.replay import read_records

    records = [record("s0", "p", [1.0, -1.0, 1.0], None),
               record("s1", "q", [1.0, 1.0, -1.0, -1.0], 2)]  # trimmed to 2 of its 4
    samples = SAMPLES[:5]  # 3 of the first prompt, 2 of the second
    store: dict[int, list] = {}

    def put(shard):
        store[len(store)] = shard
        return len(store) - 1

    batch = TrainBatch(records=records, samples=[], version=5, inflight_prompts=0,
                       shards=make_shards(samples, 2, put))
    w = RunFiles(tmp_path / "run", "a: 1\n", progress=False, record_rollouts=True,
                 fetch=lambda refs: [store[r] for r in refs])
    w.prompts(batch, step=1, version=5, t_trained=0.0, skipped=False)
    w.close()
    recs = list(read_records(tmp_path / "run" / "rollouts.msgpack"))
    assert [r["prompt_id"] for r in recs] == ["p", "q"]
    assert [r["samples"] for r in recs] == [samples[:3], samples[3:5]]
    assert [r["rewards"] for r in recs] == [[1.0, -1.0, 1.0], [1.0, 1.0]]
