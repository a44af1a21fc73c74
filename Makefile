# The two commands of README.md. Each creates the project virtualenv (.venv) if needed, installs
# everything into it, then runs. A stock Debian/Ubuntu python3 refuses `pip install` outside a
# virtualenv (PEP 668), so nothing is installed into the system interpreter.
PYTHON ?= python3
VENV ?= .venv
VPY = $(VENV)/bin/python
STAMP = $(VENV)/.installed

.PHONY: install system-deps demo test test-quick test-long fuzz bench bench-tpch bench-selection bench-quantiles bench-partition-peers bench-topk bench-thesis bench-odp bench-large bench-clickbench bench-auto-bounds clean

$(VPY):
	@$(PYTHON) -m venv $(VENV) || { echo "error: '$(PYTHON) -m venv' failed; on Debian/Ubuntu: sudo apt-get install python3-venv python3-dev gcc make"; exit 2; }
	$(VPY) -m pip install -q --upgrade pip

$(STAMP): $(VPY) setup.py pyproject.toml udf/noise.pyx udf/udf_program.pyx udf/dpch_kernel.h
	$(VPY) -m pip install -q -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/dpch demo

# Debian packages some tests drive for real: PostgreSQL (the shared ledger store) and Chromium (the
# web console's browser test). Installed with apt-get only when missing and only as root (CI); the
# tests that need them skip with the reason otherwise.
SYSTEM_PACKAGES = postgresql chromium
system-deps:
	@missing=""; \
	ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || missing="$$missing postgresql"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian packages:$$missing"; \
	    (apt-get install -y -q $$missing >/dev/null 2>&1 || \
	     (apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing >/dev/null)) \
	     || echo "warning: apt-get install$$missing failed; the tests that need them skip"; \
	  else echo "note:$$missing not installed (needs root and apt-get); the tests that need them skip"; fi; \
	fi

# lint-imports: the layer contracts of pyproject.toml (docs/ARCHITECTURE.md); a violation fails first.
# Every test, on one worker per core (pytest-xdist); a module stays on one worker (its fixtures are
# built once) and the longest modules start first (tests/conftest.py).
PYTEST_PARALLEL = -n auto --dist loadfile --no-loadscope-reorder
# Bytecode caches (__pycache__, git-ignored) are written even where the environment sets
# PYTHONDONTWRITEBYTECODE (this machine does): about 450 test processes import dpch, and without
# the caches each one compiles its modules from source again (0.3-0.4 s a process), and each pytest
# worker rewrites the assertions of every test module again (collection 14 s a worker; 5 s cached).
test test-quick test-long: export PYTHONDONTWRITEBYTECODE =
test: install system-deps
	$(VENV)/bin/lint-imports
	$(VPY) -m pytest -q $(PYTEST_PARALLEL)

# The edit loop (a few minutes): the tests marked `quick` (tests/conftest.py); CI runs `make test`.
test-quick: install
	$(VPY) -m pytest -q -m quick $(PYTEST_PARALLEL)

# The stress and fuzz loops at their full counts (DPCH_LONG=1; `make test` runs a representative part
# of each, and every iteration checks the whole property): kill -9 rounds, charge contention, fuzz examples.
LONG_TESTS = tests/test_ledger_reliability.py tests/test_ledger_concurrency.py tests/test_totality_fuzz.py \
	tests/attacks/test_attack_ptr.py
test-long: install system-deps
	DPCH_LONG=1 $(VPY) -m pytest -q $(PYTEST_PARALLEL) $(LONG_TESTS)

# Generative D/D' test of the join grammar (issue 26), much longer than in make test and with fresh
# randomness: FUZZ_EXAMPLES random schemas of up to 12 queries each (about 6 on average); every
# violation is collected (not only the first) in bench/out/join_fuzz.jsonl, the counts in
# bench/out/join_fuzz.jsonl.stats.json. Several hours for the default on 2 cores.
FUZZ_EXAMPLES ?= 3500
fuzz: install
	mkdir -p bench/out
	rm -f bench/out/join_fuzz.jsonl
	DPCH_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) DPCH_FUZZ_LOG=bench/out/join_fuzz.jsonl \
		$(VPY) -m pytest -q -s -p no:cacheprovider tests/attacks/test_join_generative.py

# The peers (the `bench` extra) are NOT installed into DPCH's environment: smartnoise-sql pins
# pandas<3 and opendp<0.15. bench/run_all.py installs them into bench/.venv-peers and
# bench/.venv-opendp (created on first use) and runs them there; see bench/RESULTS.md.
bench: install
	$(VPY) bench/run_all.py

# TPC-H for DP joins (issue 14): the `tpch` extra (tpchgen-cli) into .venv, then SF 1 at ε = 1 and
# R2T's own queries at ε = 0.8; data and stores are cached in bench/.data (see bench/RESULTS.md).
TPCH_STAMP = $(VENV)/.installed-tpch

$(TPCH_STAMP): $(STAMP)
	$(VPY) -m pip install -q -e '.[test,tpch]'
	@touch $(TPCH_STAMP)

bench-tpch: $(TPCH_STAMP)
	mkdir -p bench/out
	$(VPY) bench/bench_tpch.py --sf 1 --out bench/out/tpch_sf1.json --markdown bench/out/tpch_sf1.md
	$(VPY) bench/bench_tpch.py --sf 1 --epsilon 0.8 --queries R2T-Q3,R2T-Q10,R2T-Q18 \
		--out bench/out/tpch_sf1_r2t.json --markdown bench/out/tpch_sf1_r2t.md

# Partition selection (issue 15): released groups, old Laplace threshold vs the optimal/Gaussian
# rules, on 1 M units with Zipf keys (store cached in bench/.data/selection; see bench/RESULTS.md).
bench-selection: install
	mkdir -p bench/out
	$(VPY) bench/bench_selection.py --units 1000000 --keys 100000 --repeats 3 \
		--out bench/out/selection.json --markdown bench/out/selection.md

# Quantile accuracy against OpenDP, Tumult Analytics and PipelineDP (issue 15): same seeded data
# and ε, rank errors; OpenDP and PipelineDP in the virtualenvs of `make bench`, Tumult Analytics
# (pyspark, needs Java) in bench/.venv-tumult, all created on first use (see bench/RESULTS.md).
bench-quantiles: install
	$(VPY) bench/bench_quantiles.py

# Partition selection against PipelineDP, OpenDP and Tumult Analytics (issue 15): released true
# groups at the same (ε, δ), 100 000 units with Zipf keys over 10 000 values, k = 1 and 5; the peers
# in the virtualenvs above (created on first use; Tumult needs Java); see bench/RESULTS.md.
bench-partition-peers: install
	mkdir -p bench/out
	$(VPY) bench/bench_partition_peers.py --units 100000 --keys 10000 --repeats 10 --peer-repeats 3 \
		--out bench/out/partition_peers.json --markdown bench/out/partition_peers.md

# Noisy top-n recall (issue 15): peeling vs post-processing vs auto against the true top n, Zipf keys,
# k ∈ {1, 5, 20} keys per unit, n ∈ {1, 5, 10}, ε ∈ {0.1, 0.5, 1}, 20 releases each; 50 000 units
# and a hard regime with 5 000 (stores cached in bench/.data/topk; see bench/RESULTS.md).
bench-topk: install
	mkdir -p bench/out
	$(VPY) bench/bench_topk.py --units 50000 --keys 10000 --repeats 20 \
		--out bench/out/topk.json --markdown bench/out/topk.md
	$(VPY) bench/bench_topk.py --units 5000 --keys 10000 --repeats 20 \
		--out bench/out/topk_5000.json --markdown bench/out/topk_5000.md

# Thesis mechanisms (issue 16): MSE of the bounded Laplace (§5.5) and the sound mixed noise
# mechanism (§5.3) against Laplace and Gaussian at the same (ε, δ), kernel draws (see bench/RESULTS.md).
bench-thesis: install
	mkdir -p bench/out
	$(VPY) bench/bench_thesis_mechanisms.py --samples 200000 --out bench/out/thesis.md

# Output-DP savings (issue 16): a sparse-vector session over 500 segment tests with 3 true
# positives, c ∈ {3, 5, 10}, ε ∈ {0.5, 1}: the settled ε against the worst case, and the smaller
# noise of the counts released with the saved budget (store cached in bench/.data/odp; see bench/RESULTS.md).
bench-odp: install
	mkdir -p bench/out
	$(VPY) bench/bench_odp.py --users 100000 --segments 500 --repeats 9 \
		--out bench/out/odp.json --markdown bench/out/odp.md

# 100 M rows, 10 M units on one machine (issue 17): a user-level DP query through the controller
# against the same query at 10 M rows / 1 M units, peak RSS and time per row; the data is generated
# inside ClickHouse into a temporary store and deleted afterwards (≈ 3 GB disk; see bench/RESULTS.md).
bench-large: install
	mkdir -p bench/out
	$(VPY) bench/bench_large.py --rows 100000000 --base-rows 10000000 --reps 5 \
		--out bench/out/large.json --markdown bench/out/large.md --results-md bench/RESULTS.md

# ClickBench-style workload (issue 17): the 43 public ClickBench queries on a synthetic hits table
# (Zipf users and URLs, UserID the unit, k = 5, M = 100), DP / plain side by side at 10 M rows
# (store cached in bench/.data/clickbench-10000000; `--rows 1000000` for a quick run; see bench/RESULTS.md).
bench-clickbench: install
	mkdir -p bench/out
	$(VPY) bench/bench_clickbench.py --rows 10000000 --repeats 5 \
		--out bench/out/clickbench.json --markdown bench/out/clickbench.md
	$(VPY) bench/bench_clickbench.py --rows 10000000 --repeats 5 --accelerate \
		--out bench/out/clickbench_accelerated.json --markdown bench/out/clickbench_accelerated.md
	$(VPY) bench/bench_clickbench.py --rows 10000000 --repeats 5 --accelerate table \
		--out bench/out/clickbench_unit_table.json --markdown bench/out/clickbench_unit_table.md

clean:
	rm -rf build dpch/*.so dpch/*.c udf/*.c .dpch_data $(VENV)

# Bounds from the data (issue 29): 14 queries (newcomer-style, TPC-H SF 0.1 joins, ClickBench-style 1 M rows),
# relative error of the catalog's bounds, "auto" and the best fixed bounds on the √2 grid (oracle), ε = 0.25 and 1,
# median of 20 runs (store cached in bench/.data/auto-bounds; see bench/RESULTS.md).
bench-auto-bounds: install
	mkdir -p bench/out
	$(VPY) bench/bench_auto_bounds.py --sf 0.1 --hits-rows 1000000 --runs 20 \
		--out bench/out/auto_bounds.json --markdown bench/out/auto_bounds.md

# R2T's TPC-H queries at SF 1, ε = 0.8, with k and M chosen privately from the data ("auto", 10 % of ε),
# beside the declared-bounds run of bench-tpch and R2T's published errors (see bench/RESULTS.md).
.PHONY: bench-tpch-auto
bench-tpch-auto: $(TPCH_STAMP)
	mkdir -p bench/out
	$(VPY) bench/bench_tpch.py --sf 1 --epsilon 0.8 --queries R2T-Q3,R2T-Q10,R2T-Q18 --bounds auto \
		--out bench/out/tpch_sf1_r2t_auto.json --markdown bench/out/tpch_sf1_r2t_auto.md
