"""Entry point of `dpch-udf`, the executable UDF program that ClickHouse runs (executable_pool,
RowBinary, send_chunk_header=1): ``python -m dpch.udf_entry <function>``.

Functions: laplace, laplace_int, gaussian, gaussian_int, gaussian_sigma, quantiles, partition_select, top_k, bounded_laplace, bounded_laplace_scale (see docs/NOISE.md and
udf/README.md). Exit status: 0 at end of input, 2 bad value/scale (or unknown function), 3 malformed
input. The work is done by the compiled module `dpch._udf_program` (udf/udf_program.pyx).
"""
from __future__ import annotations

import sys

USAGE = "usage: dpch-udf {laplace|laplace_int|gaussian|gaussian_int|gaussian_sigma|quantiles|partition_select|top_k|bounded_laplace|bounded_laplace_scale}\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1 or args[0] in ("-h", "--help"):
        sys.stderr.write(USAGE)
        return 2
    from dpch._udf_program import run

    return run(args[0])


if __name__ == "__main__":
    sys.exit(main())
