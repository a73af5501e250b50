"""tests.acceptance.soak's growth figure: flat series read as flat, a known leak as its rate."""
import math

import numpy as np
import pytest

from tests.acceptance.soak.growth import after_warmup, growth_per_hour, growth_table, theil_sen


def minutes(n, every_s=60.0):
    return [i * every_s for i in range(n)]


def test_a_flat_series_does_not_grow_even_with_noise_and_an_outlier():
    rng = np.random.default_rng(0)
    t = minutes(61)
    y = list(1000.0 + rng.normal(0, 5, len(t)))
    y[40] = 5000.0  # one sample during a checkpoint write
    g = growth_per_hour(t, y)
    assert abs(g) < 0.01


def test_a_known_leak_reads_as_its_rate_per_hour_of_the_mean_level():
    t = minutes(121)  # two hours, one sample a minute
    y = [1000.0 + 50.0 * s / 3600.0 for s in t]  # +50 per hour
    g = growth_per_hour(t, y, warmup_frac=0.0)
    assert g == pytest.approx(50.0 / np.mean(y), rel=1e-9)
    # after the warm-up the mean level is higher, the same slope a smaller fraction
    g15 = growth_per_hour(t, y, warmup_frac=0.15)
    kept = [v for s, v in zip(t, y) if s >= 0.15 * t[-1]]
    assert g15 == pytest.approx(50.0 / np.mean(kept), rel=1e-9)


def test_the_warm_up_is_left_out():
    t = minutes(100)
    # a climb during the first 40 minutes (caches, compiled graphs), then flat
    y = [500.0 + 5.0 * min(s, 2400.0) / 60.0 for s in t]
    assert growth_per_hour(t, y, warmup_frac=0.0) > 0.05  # most pairs span the climb
    assert growth_per_hour(t, y, warmup_frac=0.41) == 0.0


def test_too_few_samples_or_a_zero_level_give_none():
    assert growth_per_hour([0, 60, 120], [1, 2, 3]) is None
    assert growth_per_hour(minutes(10), [0.0] * 10) is None
    assert growth_per_hour(minutes(10), [None] * 10) is None
    # missing samples are skipped, not read as zeros
    y = [None if i % 3 == 0 else 10.0 for i in range(30)]
    assert growth_per_hour(minutes(30), y) == 0.0


def test_theil_sen_and_the_table():
    assert theil_sen([0, 1, 2, 3], [1, 3, 5, 7]) == 2.0
    with pytest.raises(ValueError):
        theil_sen([1, 1], [0, 1])
    assert list(after_warmup([0, 10, 20, 30, 40], 0.5)) == [False, False, True, True, True]
    table = growth_table(minutes(20), {"flat": [3.0] * 20, "nan": [math.nan] * 20})
    assert table == {"flat": 0.0, "nan": None}


def fake_samples(n=20, leak_mb_per_min=0.0):
    return [{"t_s": 60.0 * i, "steps": 3 * i,
             "processes": {"driver": {"rss_mb": 100.0, "fds": 20},
                           "generator#0": {"rss_mb": 500.0 + leak_mb_per_min * i, "fds": 40}},
             "object_store_mb": 1.0, "object_store_objects": 5, "run_dir_mb": 1.0 + i,
             "checkpoints_mb": 3.0, "logs_mb": 0.5, "coordinator_entries": 30,
             "coordinator_state": {"inflight": 30}} for i in range(n)]


def test_the_report_names_a_leaking_role_and_leaves_a_flat_one(tmp_path):
    from types import SimpleNamespace

    from tests.acceptance.soak.plot import plot
    from tests.acceptance.soak.report import aims, series
    from tests.acceptance.soak.growth import growth_table

    samples = fake_samples(61, leak_mb_per_min=1.0)  # +60 MiB/h on ~530 MiB: ~11 %/h
    ser = series(samples)
    assert ser["rss_mb/total"][0] == 600.0
    g = growth_table([s["t_s"] for s in samples], ser)
    assert g["rss_mb/driver"] == 0.0 and g["fds/generator#0"] == 0.0
    assert 0.10 < g["rss_mb/generator#0"] < 0.12
    g["step_s"] = 0.01
    a = aims(g, duration_s=3700, steps=1200)
    assert not a["met"] and not a["rss_under_5pct_per_hour"]
    assert "rss_mb/generator#0" in a["over_the_aim"]
    assert a["run_state_under_5pct_per_hour"] and a["step_time_within_10pct_per_hour"]
    flat = growth_table([s["t_s"] for s in fake_samples(61)], series(fake_samples(61)))
    flat["step_s"] = 0.0
    assert aims(flat, 3700, 1200)["met"] and not aims(flat, 600, 1200)["met"]
    shrinking = {**flat, "checkpoints_mb": -0.3, "rss_mb/driver": -0.2}  # memory may shrink
    assert aims(shrinking, 3700, 1200)["met"]
    assert not aims({**flat, "step_s": -0.2}, 3700, 1200)["met"]  # step time must be flat
    out = {"series": {"t_s": [s["t_s"] for s in samples], **ser}, "growth_per_hour": g,
           "warmup_frac": 0.15, "step_series": {"t_s": [0, 10], "step_time_s": [5.0, 5.1]},
           "steps": 10, "duration_s": 3600, "prompts_lost": 0}
    assert plot(out, tmp_path / "soak.png").stat().st_size > 10_000


def test_processes_are_named_by_their_role():
    from tests.acceptance.soak.sampler import role_of

    assert role_of("ray::Generator.generate") == "generator"
    assert role_of("ray::LearnerWorker") == "learnerworker"
    assert role_of("VLLM::EngineCore") == "vllm-enginecore"
    assert role_of("/site-packages/ray/core/src/ray/raylet/raylet --flag") == "raylet"
    assert role_of("/usr/bin/python3 /site/ray/_private/log_monitor.py --x") == "log_monitor"
    assert role_of("python3 -m ray.dashboard.agent --x") == "agent"
    assert role_of("python -c from multiprocessing.resource_tracker import main;main(7)") == \
        "resource_tracker"


def test_a_process_that_becomes_an_actor_is_named_again():
    """Ray's setup_worker execs the actor's worker in the same process (same pid, same start
    time): the series must follow the role, not stay with the first title."""
    import os

    from tests.acceptance.soak.sampler import Processes

    class Fake:
        pid, ppid_ = 4242, 1

        def __init__(self, title):
            self.title = title

        def create_time(self):
            return 123.0

        def cmdline(self):
            return self.title.split()

        def name(self):
            return "python"

    procs = Processes(os.getpid())
    assert procs._name(Fake("ray::IDLE"), None) is None
    assert procs._name(Fake("python /x/ray/_private/workers/setup_worker.py --a"), None) == \
        "setup_worker#0"
    assert procs._name(Fake("ray::Coordinator"), None) == "coordinator#0"
    assert procs._name(Fake("ray::Coordinator.next_batch"), None) == "coordinator#0"
    assert procs._name(Fake("VLLM::EngineCore"), "generator#1") == "generator#1/vllm-enginecore#0"


GCS_DUMP = """[2026-12-02 14:16:35] gcs_server.cc:1322: state dump
GcsNodeManager:
- RegisterNode request count: 1
Publisher:
RAY_LOG_CHANNEL
- cumulative published bytes: 12208
- current buffered bytes: 895
RAY_ERROR_INFO_CHANNEL
- current buffered bytes: 5

GcsTaskManager:
-Total num task events reported: 52
-Current num of task events stored: 17
"""


def test_gcs_state_reads_the_last_dump_of_gcs_servers_log():
    from tests.acceptance.soak.sampler import gcs_state

    older = GCS_DUMP.replace("stored: 17", "stored: 3").replace("reported: 52", "reported: 9")
    assert gcs_state(older + GCS_DUMP) == {"gcs_task_events": 17, "gcs_task_events_reported": 52,
                                           "gcs_buffered_bytes": 900}
    assert gcs_state("no dump yet") == {}
