"""TPC-H workload of bench/bench_tpch.py (issue 14): schema and catalog, queries, the spec's data model."""
