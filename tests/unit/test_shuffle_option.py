"""``pytest --shuffle SEED`` (tests/conftest.py's collection hook): a permutation of the
collected tests in which each module's tests stay together, the same for the same seed,
different for another, and the collected order when the option is not given."""
from dataclasses import dataclass

import conftest


@dataclass
class _Item:
    nodeid: str


class _Config:
    def __init__(self, seed):
        self.seed = seed

    def getoption(self, name):
        assert name == "shuffle"
        return self.seed


COLLECTED = [_Item(f"tests/unit/test_{m}.py::test_{t}[{p}]")
             for m in "abcdef" for t in range(4) for p in range(2)]


def _order(seed) -> list[str]:
    items = list(COLLECTED)
    conftest.pytest_collection_modifyitems(_Config(seed), items)
    return [i.nodeid for i in items]


def test_shuffle_permutes_modules_and_tests_keeping_each_module_together():
    plain = [i.nodeid for i in COLLECTED]
    assert _order(None) == plain
    a, b = _order(1), _order(2)
    assert a == _order(1) and a != b
    for order in (a, b):
        assert sorted(order) == sorted(plain) and order != plain
        modules = [t.split("::")[0] for t in order]
        blocks = [m for i, m in enumerate(modules) if i == 0 or modules[i - 1] != m]
        assert sorted(blocks) == sorted(set(modules))  # each module's tests in one block
        assert blocks != sorted(blocks)                 # the modules themselves reordered
    assert conftest.pytest_report_header(_Config(7)) == "test order shuffled with seed 7"
