"""ClickBench-style workload for DPCH (issue 17): a synthetic hits-like table, the public query set."""
