"""Actor names on the Ray dashboard: ``<run>/<role>``, and the first free ``~N`` when a name
is still held in the job's namespace (common/names.py; the real names on a running job are
checked in tests/integration/test_job_submit.py)."""
from common.names import first_free, role_name


def test_a_role_is_named_by_its_run_and_role():
    assert role_name("v05-cpu", "generator-0") == "v05-cpu/generator-0"
    assert role_name("job", "learner-rank-1") == "job/learner-rank-1"


def test_a_held_name_gets_the_first_free_count():
    held = {"r/prior", "r/prior~2", "r/prior~4"}
    assert first_free("r/coordinator", held.__contains__) == "r/coordinator"
    assert first_free("r/prior", held.__contains__) == "r/prior~3"


def test_nothing_is_looked_up_once_a_name_is_free():
    asked = []
    first_free("r/telemetry", lambda n: asked.append(n) or False)
    assert asked == ["r/telemetry"]
