"""The house rules of the product code (docs/architecture.md), checked on the source itself:
the packages stand in layers and import only downwards, no two modules import each other,
no product function is over 60 lines, and the driver's loop reads like its pseudocode
(``Trainer.one_step`` at most 25 lines).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Floors, bottom to top: a package may import those on the floors below it and itself, never
# one above, nor one beside it (actors and learner share a floor: docs/architecture.md).
# studies/ (questions answered once, kept as documented scripts) import only the product;
# bench/ may read a study's arithmetic (bench.sim takes the prior's measured error from
# studies.prior_truth's file, computed as the study computed it).
FLOORS = (("estimator",), ("common",), ("tasks",), ("actors", "learner"), ("cluster",),
          ("studies",), ("bench",))
LAYERS = tuple(pkg for floor in FLOORS for pkg in floor)
PRODUCT = LAYERS[:-2]  # studies/ and bench/ are measurement code: their limits are not these
MAX_FUNCTION_LINES = 60


def modules(packages=LAYERS) -> dict[str, Path]:
    out = {}
    for pkg in packages:
        for path in sorted((REPO / pkg).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The project modules ``path`` imports, at module level or inside functions."""
    tree = ast.parse(path.read_text())
    out = set()
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for n in names:
            while n and n not in known:
                n = n.rpartition(".")[0]
            if n and n != name:
                out.add(n)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports(p, m, known) for m, p in mods.items()}


def package(module: str) -> str:
    return module.split(".")[0]


def layer(module: str) -> int:
    return next(i for i, floor in enumerate(FLOORS) if package(module) in floor)


def test_packages_import_only_downwards():
    up = sorted(f"{m} -> {d}" for m, deps in graph().items() for d in deps
                if layer(d) > layer(m))
    assert up == []


def test_packages_on_one_floor_never_import_each_other():
    beside = sorted(f"{m} -> {d}" for m, deps in graph().items() for d in deps
                    if layer(d) == layer(m) and package(d) != package(m))
    assert beside == []


def test_no_two_modules_import_each_other():
    g = graph()
    # A package's __init__ re-exporting its own modules is not a circle between rooms.
    circles = sorted(f"{a} <-> {b}" for a, deps in g.items() for b in deps
                     if a < b and a in g.get(b, set())
                     and not (b.startswith(a + ".") or a.startswith(b + ".")))
    assert circles == []


# cluster/'s rooms (docs/architecture.md), bottom to top: a room imports only the rooms below
# it; the bottom three import no other room.
CLUSTER_ROOMS = (("config", "records", "nodes"), ("report",), ("run",),
                 ("launch", "install", "evaluate"))


def room(module: str) -> int:
    name = module.split(".")[1]
    return next(i for i, floor in enumerate(CLUSTER_ROOMS) if name in floor)


def test_clusters_rooms_import_only_the_rooms_below():
    wrong = sorted(f"{m} -> {d}" for m, deps in graph().items() if m.startswith("cluster.")
                   for d in deps if d.startswith("cluster.") and d.split(".")[1] != m.split(".")[1]
                   and room(d) >= room(m))
    assert wrong == []


def test_the_architecture_pages_links_stay_inside_the_repository():
    page = REPO / "docs" / "architecture.md"
    links = re.findall(r"\]\(([^)#]+)", page.read_text())
    outside = [t for t in links if "://" in t or not (page.parent / t).resolve().is_relative_to(REPO)
               or not (page.parent / t).exists()]
    assert links and outside == []


def test_no_product_function_over_60_lines():
    """A function past a screen is doing several jobs. Files have no cap: a file is as long
    as its one job needs (a 400-line cap made learner/state_io.py a mixin and
    actors/priors/baseline.py a split of kernel.py; issue 44)."""
    long_functions = []
    for name, path in modules(PRODUCT).items():
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long_functions.append(f"{name}.{node.name}: {n}")
    assert long_functions == []


def test_the_driver_loop_is_short_enough_to_read_as_its_pseudocode():
    """One step of the loop reads as the pseudocode in cluster/run/trainer.py's docstring. The
    class around it has no line cap of its own (issue 30: a cap of 150 on it had lines packed
    to fit; the file and function guides above stay)."""
    tree = ast.parse((REPO / "cluster" / "run" / "trainer.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    step = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "one_step")
    assert step.end_lineno - step.lineno + 1 <= 25


def test_no_two_test_modules_share_a_basename():
    """tests/ has no __init__.py files, so pytest imports each test module by its basename:
    a second module of the same name fails the whole suite's collection ('import file
    mismatch'), while each tier alone still passes."""
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        if path.name in seen:
            clashes.append(f"{seen[path.name].relative_to(REPO)} and {path.relative_to(REPO)}")
        seen.setdefault(path.name, path)
    assert clashes == []


def test_the_schedulers_counters_are_a_record_read_by_attribute():
    """Issue 44: a counter written under string keys in three places drifted (one counted and
    read nowhere, one event under two names). The scheduler's are ``SchedulerCounts`` fields,
    written as attributes; no module indexes ``counts`` of the scheduler by a string."""
    from dataclasses import fields

    from actors.scheduler import Scheduler, SchedulerConfig
    from common.records import Accounting, SchedulerCounts
    from estimator import make_estimator

    s = Scheduler(SchedulerConfig(batch_prompts=1, max_staleness=0, slots_per_generator=4),
                  make_estimator("grpo"), 1)
    assert isinstance(s.counts, SchedulerCounts)
    assert isinstance(s.accounting(), Accounting) and s.accounting().scheduler == s.counts
    names = {f.name for f in fields(SchedulerCounts)}
    for path in (REPO / "actors").rglob("*.py"):
        text = path.read_text()
        indexed = re.findall(r'(?:sched|self)\.counts\["(\w+)"\]', text)
        assert not (set(indexed) & names), (path.name, indexed)
    assert "generator_restarts" not in {f.name for f in fields(Accounting)}


def record_dicts(tree: ast.AST) -> list[str]:
    """Fields annotated a dict (``DICT_TYPES``) in the counters' records: the classes named
    ``...Counts`` and ``Accounting``. Names and lines."""
    return [f"{c.name}.{n.target.id}:{n.lineno}" for c in ast.walk(tree)
            if isinstance(c, ast.ClassDef) and (c.name.endswith("Counts") or c.name == "Accounting")
            for n in c.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
            and _is_dict_type(n.annotation)]


def test_the_drops_are_counted_by_a_closed_set_of_reasons():
    """Issue 44: ``Accounting.drop_reasons`` was a reason -> count dict whose names were an
    open set (``generator_error: <exception type>`` among them), written by the scheduler and
    the run's summary and read by name by the report; it is ``DropCounts``, a field per
    ``DropReason`` (the exception's type goes to dropped.jsonl's line only)."""
    from dataclasses import fields

    from actors.scheduler import Scheduler, SchedulerConfig
    from common.records import Accounting, DropCounts, DropReason
    from estimator import make_estimator

    found = record_dicts(ast.parse((REPO / "common" / "records.py").read_text()))
    assert found == [], f"a counters' record holds a string-keyed dict: {found}"
    assert {f.name for f in fields(DropCounts)} == {r.value for r in DropReason}
    s = Scheduler(SchedulerConfig(batch_prompts=1, max_staleness=0, slots_per_generator=4),
                  make_estimator("grpo"), 1)
    assert isinstance(s.drops, DropCounts) and isinstance(Accounting().drop_reasons, DropCounts)
    # and the check can fail: a counters' record with a dict field is found
    assert record_dicts(ast.parse("class Accounting:\n    drop_reasons: dict = field()\n"
                                  "class FaultCounts:\n    by_kind: 'Counter | None' = None\n"
                                  "class Other:\n    env: dict = None\n")) \
        == ["Accounting.drop_reasons:2", "FaultCounts.by_kind:4"]


def used_only_by_measurement(product: dict[str, str], measurement: dict[str, str]) -> list[str]:
    """Public functions, classes and methods defined in ``product`` (path -> source) that
    bench/ or studies/ (``measurement``) use and the product does not: a function's or a
    class's name mentioned nowhere in the product but where it is defined, a method's name
    never read as an attribute (``.reset``) or named as a string (``getattr``) there. Any
    mention counts as a use (a docstring's too): the check errs towards passing."""
    everything = "\n".join(product.values())
    measured = "\n".join(measurement.values())
    out = []
    for path, text in product.items():
        tree = ast.parse(text)
        methods = {id(n) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for n in c.body
                   if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                    or node.name.startswith("_"):
                continue
            name = re.escape(node.name)
            if id(node) in methods:
                use, defined = re.compile(rf"\.{name}\b|[\"']{name}[\"']"), 0
            else:
                use, defined = re.compile(rf"\b{name}\b"), 1
            if len(use.findall(everything)) <= defined and use.search(measured):
                out.append(f"{path}:{node.lineno} {node.name}")
    return out


def test_no_product_code_is_kept_for_a_benchmark_or_a_study_alone():
    """Issue 44: product modules kept code only a benchmark or a study used
    (``PriorServer.reset``, ``wait_ready``, ``read_metrics``, ``Spec.carries``; before them
    ``reset_roles``, ``seed_spread_check``, ``trainable_count``); such code lives in bench/
    or studies/ (docs/architecture.md)."""
    def sources(packages):
        return {str(p.relative_to(REPO)): p.read_text() for p in modules(packages).values()}

    found = used_only_by_measurement(sources(PRODUCT), sources(("bench", "studies")))
    assert found == [], f"product code that only bench/ or studies/ use: {found}"
    # and the check can fail: a product method only a bench calls is found
    product = {"a.py": "class Server:\n    def reset(self):\n        pass\n"
                       "    def serve(self):\n        return self.helper()\n"
                       "    def helper(self):\n        return 1\n",
               "c.py": "def main(server):\n    server.serve()\n"}
    bench = {"b.py": "server.reset()\nserver.serve()\n"}
    assert used_only_by_measurement(product, bench) == ["a.py:2 reset"]
    assert used_only_by_measurement({"a.py": "def wait_ready(h):\n    pass\n"},
                                    {"b.py": "wait_ready([g])\n"}) == ["a.py:1 wait_ready"]


# Who may store a policy version (issue 44: it had six holders, three checking "only goes up"
# each): its owner, and those that keep what they were last told. A new attribute that stores
# a version anywhere else in the product fails here; records that carry the version they were
# made at (a rollout, a payload, a step's line) are facts about themselves, not holders.
VERSION_HOLDERS = {
    ("Roles", "published"),         # the owner (cluster.nodes.roles): advance, adopt
    ("Scheduler", "version"),       # told by the coordinator's set_version (admission, staleness)
    ("Generator", "_version"),      # the weights its engine serves (update_weights)
    ("PriorServer", "_latest_version"),  # the newest its observations name (their ages)
}


def version_writes(tree: ast.AST) -> set[tuple[str | None, str]]:
    """(innermost enclosing class or None, attribute) of every assignment to an attribute
    named like a version (``x.version = ...``, ``self._version += ...``, ``roles.published``)."""
    out = set()

    def visit(node, cls):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.ClassDef) else cls
            if isinstance(child, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                out.update((cls, t.attr) for t in targets if isinstance(t, ast.Attribute)
                           and ("version" in t.attr or t.attr == "published"))
            visit(child, inner)

    visit(tree, None)
    return out


def test_the_policy_version_is_stored_by_its_owner_and_the_told_copies_only():
    found = {(path.name, *w) for path in modules(PRODUCT).values()
             for w in version_writes(ast.parse(path.read_text()))}
    others = sorted(f for f in found if (f[1], f[2]) not in VERSION_HOLDERS)
    assert others == [], f"a version stored outside its holders: {others}"
    # and the check can fail: a write from outside the owner is found
    assert version_writes(ast.parse("def publish(roles, v):\n    roles.published = v\n")) \
        == {(None, "published")}


def test_start_up_times_are_read_by_attribute():
    """Issue 44: ``Roles.startup`` was a dict written under f-string keys (cluster.nodes.roles)
    and read by literal name (cluster.launch); it is ``Startup``, indexed by no one."""
    indexed = [(p.name, m) for p in modules(LAYERS).values()
               for m in re.findall(r"startup\[[^\]]+\]", p.read_text())]
    assert indexed == []


# A role's report of itself is a record read by attribute (issue 44: string-keyed stats dicts
# crossed from the generators, the prior server and the selector to their readers, each key
# spelled again by every reader). Named so, it returns no dict; serialisers (``to_dict``,
# ``to_json``), checkpoints (``snapshot``) and test hooks (``sizes``, ``state_size``) are
# other names.
REPORT_NAMES = {"stats", "counts", "counters", "metrics"}
# a dict and its string-keyable kin (a Counter is a dict)
DICT_TYPES = {"dict", "Dict", "Counter", "defaultdict", "DefaultDict", "OrderedDict"}


def _is_dict_type(node: ast.AST | None) -> bool:
    """Whether an annotation says dict (``DICT_TYPES``): ``dict``, ``dict[...]``,
    ``typing.Dict``, ``dict | None``, ``Counter``, ``collections.Counter``."""
    if node is None:
        return False
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a quoted annotation
        return _is_dict_type(ast.parse(node.value, mode="eval").body)
    if isinstance(node, ast.Subscript):
        return _is_dict_type(node.value)
    if isinstance(node, ast.BinOp):  # X | Y
        return _is_dict_type(node.left) or _is_dict_type(node.right)
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
    return name in DICT_TYPES


def _is_dict_value(node: ast.AST | None, dict_names: set[str]) -> bool:
    """Whether an expression makes a dict: ``{...}``, a dict comprehension, ``dict(...)``,
    ``Counter()``, ``collections.defaultdict(int)``, a dataclass
    ``field(default_factory=dict)``, or a local name assigned one of those."""
    if isinstance(node, (ast.Dict, ast.DictComp)):
        return True
    if isinstance(node, ast.Call):
        return _is_dict_type(node.func) or any(
            k.arg == "default_factory" and _is_dict_type(k.value) for k in node.keywords)
    return isinstance(node, ast.Name) and node.id in dict_names


def dict_reports(tree: ast.AST) -> list[str]:
    """Functions and methods named like a report of counters (``REPORT_NAMES``, leading
    underscores aside) that say they return a dict or return one; their names and lines."""
    out = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or \
                fn.name.lstrip("_") not in REPORT_NAMES:
            continue
        body = list(ast.walk(fn))
        dict_names = {t.id for n in body if isinstance(n, ast.Assign)
                      and _is_dict_value(n.value, set())
                      for t in n.targets if isinstance(t, ast.Name)}
        returns = [n.value for n in body if isinstance(n, ast.Return)]
        if _is_dict_type(fn.returns) or any(_is_dict_value(r, dict_names) for r in returns):
            out.append(f"{fn.name}:{fn.lineno}")
    return out


def product_findings(check) -> list[str]:
    """``check(tree)``'s findings in every product module, each prefixed with its module."""
    return sorted(f"{name}:{found}" for name, path in modules(PRODUCT).items()
                  for found in check(ast.parse(path.read_text())))


def finds_each(check, planted: list[str]) -> bool:
    """Whether ``check`` finds exactly one thing in each planted source: it can fail."""
    return [len(check(ast.parse(src))) for src in planted] == [1] * len(planted)


def test_no_stats_or_counts_report_returns_a_dict():
    found = product_findings(dict_reports)
    assert found == [], f"a stats/counts report returns a dict, not a record: {found}"
    # and the check can fail: each way of returning a dict is found
    planted = ["def stats(self) -> dict:\n    return {}\n",
               "class G:\n    def stats(self):\n        return {'busy_s': 1.0}\n",
               "def counts(self) -> 'dict[str, int] | None':\n    return None\n",
               "async def _metrics(self):\n    return dict(loss=1.0)\n",
               "def stats(self):\n    out = {}\n    out['n'] = 1\n    return out\n",
               "def stats(self):\n    return {k: 0 for k in 'ab'}\n",
               "class S:\n    @property\n    def counts(self) -> Counter:\n        return self.c\n",
               "def counters(self):\n    return collections.Counter(self.seen)\n"]
    assert finds_each(dict_reports, planted)
    assert dict_reports(ast.parse("def stats(self) -> Rec:\n    return Rec(n=1)\n"
                                  "def to_dict(self) -> dict:\n    return {}\n")) == []


# A role's counters are a record, and so is what a reader holds of them (issue 44: the fault
# log's and the scorer's counters were Counters written under kind names and f-strings, each
# name spelled again by their readers). An attribute or a class's field named like counters
# (``REPORT_NAMES``) holds no dict (``DICT_TYPES``: a Counter, a defaultdict, ...) and nothing
# indexes one by a literal or f-string name; a report of counters that returns one is
# ``dict_reports``'s.


def counter_dicts(tree: ast.AST) -> list[str]:
    """Attributes (``self.counts = Counter()``, ``self._stats: dict = ...``) and class fields
    (``counts: dict = field(default_factory=dict)``) named like counters, leading underscores
    aside, assigned or annotated a dict; and such an attribute indexed by a string literal or
    an f-string (``x.counts["scored"]``, ``self.counts[f"score_{why}"]``). Names and lines."""
    out = []

    def named(name: str) -> bool:
        return name.lstrip("_") in REPORT_NAMES

    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            out += [f"{node.name}.{n.target.id}:{n.lineno}" for n in node.body
                    if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                    and named(n.target.id)
                    and (_is_dict_type(n.annotation) or _is_dict_value(n.value, set()))]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            typed = isinstance(node, ast.AnnAssign) and _is_dict_type(node.annotation)
            out += [f".{t.attr}:{node.lineno}" for t in targets
                    if isinstance(t, ast.Attribute) and named(t.attr)
                    and (typed or _is_dict_value(node.value, set()))]
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                and named(node.value.attr) and (isinstance(node.slice, ast.JoinedStr) or (
                    isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str))):
            out.append(f".{node.value.attr}[...]:{node.lineno}")
    return out


def test_no_counters_are_held_or_read_as_a_string_keyed_dict():
    from actors.fault_log import FaultCounts, FaultLog
    from actors.scoring import Scorer
    from common.records import Accounting, ScoringCounts

    found = product_findings(counter_dicts)
    assert found == [], f"counters held or read as a string-keyed dict: {found}"
    assert isinstance(FaultLog().counts, FaultCounts)
    assert isinstance(Scorer(task=None).counts, ScoringCounts)
    assert isinstance(Accounting().scoring, ScoringCounts)
    # and the check can fail: each way of holding counters in a dict, or reading them by name
    planted = ["class F:\n    def __init__(self):\n        self.counts = Counter()\n",
               "def f(self):\n    self._counters = {}\n",
               "def f(self):\n    self.stats = dict(n=0)\n",
               "def f(self):\n    self.counts = collections.defaultdict(int)\n",
               "def f(self):\n    self.metrics: dict[str, float] = load()\n",
               "class A:\n    counts: Counter = field(default_factory=Counter)\n",
               "class A:\n    stats: 'dict | None' = None\n",
               "n = log.counts['prior_fallbacks']\n",
               "def f(self, why):\n    self.counts[f'score_{why}'] += 1\n"]
    assert finds_each(counter_dicts, planted)
    assert counter_dicts(ast.parse(
        "class A:\n    counts: Rec = field(default_factory=Rec)\n"
        "def f(self):\n    self.counts = Rec()\n    self.counts.scored += 1\n"
        "    self.failures = Counter()\n    self.counts.of({'x': 1})\n"
        "    return self.counts[0], rows['counts']\n")) == []
