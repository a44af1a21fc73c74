# ClickHouse server with DPCH's noise UDF program (Cython) and SQL functions installed.
FROM clickhouse/clickhouse-server:25.8
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc \
    && rm -rf /var/lib/apt/lists/*
COPY . /opt/dpch-src
# Only what the UDF program needs at run time: the package and its compiled extensions, without the
# controller's dependencies (chDB, pandas, scikit-learn, matplotlib, ...). `--no-deps` installs
# the `udf` extra of setup.py, which is empty; the build requirements (Cython, numpy) live only in
# pip's isolated build environment.
RUN python3 -m venv /opt/dpch && /opt/dpch/bin/pip install --no-cache-dir --no-deps '/opt/dpch-src[udf]' \
    && mkdir -p /etc/clickhouse-server/dpch/user_scripts /etc/clickhouse-server/dpch/udf /var/lib/clickhouse/user_defined \
    && printf '#!/bin/sh\nexec /opt/dpch/bin/python -m dpch.udf_entry "$@"\n' > /etc/clickhouse-server/dpch/user_scripts/dpch-udf \
    && chmod 755 /etc/clickhouse-server/dpch/user_scripts/dpch-udf \
    && cp /opt/dpch-src/clickhouse_config/udf/*.xml /etc/clickhouse-server/dpch/udf/ \
    && cp /opt/dpch-src/clickhouse_config/user_defined/*.sql /var/lib/clickhouse/user_defined/ \
    && cp /opt/dpch-src/clickhouse_config/config.d/*.xml /etc/clickhouse-server/config.d/ \
    && chown -R clickhouse:clickhouse /var/lib/clickhouse/user_defined
