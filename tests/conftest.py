"""Shared fixtures. chDB holds one store per process, so every test that needs the embedded
engine shares the session-scoped `db` connection (tables are namespaced per test module).

Parallel runs (`make test`: pytest-xdist, `-n auto --dist loadfile --no-loadscope-reorder`). Each
worker is its own process with its own `db` store (tmp_path_factory is per worker). A module runs
whole on one worker, so its module fixtures (tables it builds, a gateway it starts) are built once and
its tests keep their order. Modules go out longest first, by their measured seconds
(tests/module_seconds.py), so that no long module starts last and keeps one worker busy alone at
the end.
(`--dist loadgroup` would spread single tests, but with pytest 9.2 it silently stops grouping:
pytest-xdist issue #1386.)

`make test-quick` runs the tests marked `quick`: the modules in QUICK below, for the edit loop.
"""
from __future__ import annotations

import pytest

# The edit loop's subset (`make test-quick`, ≤ 3 min on 2 cores): the mechanisms and their
# calibration, the accountants and the ledger, the catalog, and the controller's path from SQL to a
# charged release (the accepted/rejected corpus, sensitivity, rewrite equivalence, type check).
# Chosen by measured time (docs/PERFORMANCE.md, "Test time"): about 470 s of test time at load 15.
QUICK = frozenset({
    "test_accounting", "test_audit_stats", "test_budget_units", "test_calibration", "test_catalog",
    "test_controller_corpus", "test_controller_sensitivity", "test_exponential_mechanism", "test_gateway_params",
    "test_ledger", "test_mechanisms", "test_plan_bounds", "test_rewrite_equivalence", "test_samplers",
    "test_typecheck_relation",
})


@pytest.fixture(scope="session")
def db(tmp_path_factory):
    import dpch

    conn = dpch.connect(tmp_path_factory.mktemp("dpch_engine"), analyst="tester")
    yield conn
    conn.close()


def pytest_ignore_collect(collection_path, config):
    """Under `-m quick` (make test-quick) only the QUICK modules are imported: collecting every module
    would take longer than running the subset."""
    if config.getoption("markexpr") == "quick" and collection_path.suffix == ".py" \
            and collection_path.name.startswith("test_") and collection_path.stem not in QUICK:
        return True
    return None


def pytest_itemcollected(item):
    if getattr(item, "module", None) is not None and item.module.__name__.rpartition(".")[2] in QUICK:
        item.add_marker(pytest.mark.quick)


def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput"):  # only on xdist's workers: their order is the work queue's
        return
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    # longest first by measured seconds (tests/module_seconds.json; a module not measured yet: 30 s
    # if it has a `slow` test, else 0.1 s a test), kept by --no-loadscope-reorder: a worker takes the
    # next module when it runs out, so the run ends on short modules on both workers
    import module_seconds

    seconds = module_seconds.load()

    def expected(path: str, module: list) -> float:
        if path in seconds:
            return seconds[path]
        return 30.0 if any(i.get_closest_marker("slow") for i in module) else 0.1 * len(module)

    order = sorted(modules.items(), key=lambda kv: -expected(*kv))
    items[:] = [i for _, module in order for i in module]


@pytest.fixture(autouse=True)
def _fresh_plan_cache():
    """Tests monkeypatch calibrations and rebuild catalogs: a plan that an earlier test prepared
    (dpch.plan_cache) must not answer for a later one."""
    from dpch import plan_cache

    plan_cache.clear()
    yield
