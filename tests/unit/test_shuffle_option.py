"""``pytest --shuffle SEED`` (tests/conftest.py): a permutation of the collected tests in which
each module's tests stay together, the same for the same seed, different for another."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = ["tests/unit/test_paths.py", "tests/unit/test_tiers.py", "tests/unit/test_logs.py",
           "tests/unit/test_math_jsonl.py"]


def _collected(*extra: str) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider",
                          *extra, *MODULES], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return [line for line in out.stdout.splitlines() if "::" in line]


def test_shuffle_permutes_modules_and_tests_keeping_each_module_together():
    a, a_again, b = _collected("--shuffle", "1"), _collected("--shuffle", "1"), \
        _collected("--shuffle", "2")
    assert len(a) > 10 and sorted(a) == sorted(b)  # the same tests, each once
    for order in (a, b):
        modules = [t.split("::")[0] for t in order]
        runs = [m for i, m in enumerate(modules) if i == 0 or modules[i - 1] != m]
        assert sorted(runs) == sorted(set(modules))  # each module's tests in one block
    assert a == a_again and a != b
