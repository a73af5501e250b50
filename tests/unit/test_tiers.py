"""The fast tier skips tests/integration/ without importing it (tests/conftest.py), which is
right only while every module there marks all its tests integration: checked here from the
source, without importing a module (they import Ray)."""
import ast
from pathlib import Path

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"


def _marks(node: ast.expr) -> list[str]:
    items = node.elts if isinstance(node, (ast.List, ast.Tuple)) else [node]
    return [ast.unparse(x) for x in items]


def test_every_integration_module_marks_all_its_tests_integration():
    modules = sorted(INTEGRATION.glob("test_*.py"))
    assert modules
    for path in modules:
        tree = ast.parse(path.read_text())
        marks = [m for node in tree.body if isinstance(node, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
                 for m in _marks(node.value)]
        assert "pytest.mark.integration" in marks, f"{path.name}: no module-level integration mark"
