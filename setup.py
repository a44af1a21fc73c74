"""Build DPCH: the Cython noise kernel and UDF program (sources in udf/), the dpch package,
the `dpch` CLI and the `dpch-udf` program that ClickHouse runs as an executable_pool."""
import os
import shutil

import numpy
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup
from setuptools.command.build_py import build_py


class build_py_with_config(build_py):
    """Ship clickhouse_config/ inside the wheel (dpch/_clickhouse_config) so a non-editable
    install still finds the UDF XML and SQL functions."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "dpch", "_clickhouse_config")
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree("clickhouse_config", target)


extensions = [
    Extension("dpch._noise", ["udf/noise.pyx"], include_dirs=["udf", numpy.get_include()],
              extra_compile_args=["-O3"]),
    Extension("dpch._udf_program", ["udf/udf_program.pyx"], include_dirs=["udf", numpy.get_include()],
              extra_compile_args=["-O3"]),
]

setup(
    name="dpch",
    version="0.1.0",
    description="Differential Privacy for ClickHouse",
    python_requires=">=3.10",
    packages=find_packages(include=["dpch", "dpch.*"]),
    package_data={"dpch.gateway.console": ["static/*"]},  # the web console's page, script and style sheet
    # the two extensions are translated and compiled side by side: `pip install -e . --no-deps` 43 -> 30 s
    ext_modules=cythonize(extensions, language_level=3, nthreads=min(2, os.cpu_count() or 1)),
    options={"build_ext": {"parallel": os.cpu_count() or 1}},
    cmdclass={"build_py": build_py_with_config},
    install_requires=[
        "chdb>=4.4",
        "clickhouse-connect>=0.8",
        "numpy>=1.26",
        "pandas>=2.0",
        "Cython>=3.0",
        # the mypyc-compiled build (sqlglotc, the "c" extra): parsing 3.8x, SQL generation 1.8x faster
        "sqlglot[c]>=30.30",
        "scipy>=1.11",
        "scikit-learn>=1.4",
        "matplotlib>=3.8",
        "tqdm>=4.66",
        "starlette>=0.37",
        "uvicorn>=0.29",
        "argon2-cffi>=23.1",
        # the gateway's native TCP protocol (dpch.gateway.native): ClickHouse's compressed frames are
        # LZ4 with a CityHash128 v1.0.2 checksum (the same two packages clickhouse-driver uses)
        "lz4>=4.0",
        "clickhouse-cityhash>=1.0.2",
    ],
    extras_require={
        # What the UDF program (`dpch-udf`, dpch/udf_entry.py -> dpch._udf_program) needs at run time
        # beyond this package and its compiled extensions: nothing (no numpy either; checked by
        # tests/test_packaging.py). The server image installs the package with `--no-deps`, so it
        # gets exactly this extra's requirements and not the controller's (chDB, pandas, scikit-learn,
        # matplotlib, ...). Keep this list in step with the Dockerfile.
        "udf": [],
        # tpchgen-cli: tests/test_tpch.py generates SF 0.01; import-linter (and its grimp): the layer
        # contracts of pyproject.toml (`lint-imports` in make test) and tests/test_architecture.py
        # pytest-xdist: make test runs on every core; the client libraries (issue 30) are driven against
        # the real gateway by tests/clients; psycopg: the PostgreSQL ledger store (a real server from
        # Debian's postgresql package, started by the tests); playwright: the web console's browser test
        # (Debian's chromium, installed by `make system-deps`)
        "test": ["pytest>=8", "hypothesis>=6.100", "testcontainers>=4.0", "dp-accounting>=0.4", "httpx>=0.27",
                 "tpchgen-cli>=4.0", "import-linter>=2.1", "pytest-xdist>=3.5", "clickhouse-driver>=0.2.9",
                 "sqlalchemy>=2.0", "ibis-framework[clickhouse]>=10.0", "psycopg[binary]>=3.2", "playwright>=1.45"],
        "bench": ["smartnoise-sql", "pipeline-dp", "opendp[polars]"],
        # bench/bench_tpch.py: the TPC-H data generator (writes Parquet; no other dependency)
        "tpch": ["tpchgen-cli>=4.0"],
    },
    entry_points={"console_scripts": ["dpch=dpch.cli:main", "dpch-udf=dpch.udf_entry:main"]},
)
