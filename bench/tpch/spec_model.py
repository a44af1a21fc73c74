"""How many rows one customer has, by the TPC-H specification's data model (v3.0.1, clause 4.2.3),
never by the generated data: the source of every row cap M (max_rows_per_unit) of the benchmark.

* There are SF * 1,500,000 orders and SF * 150,000 customers; O_CUSTKEY is drawn uniformly among
  the customers whose key is not a multiple of 3, so an ordering customer has Poisson(15) orders.
* O_ORDERDATE is uniform in [STARTDATE, ENDDATE - 151 days] = [1992-01-01, 1998-08-02], 2406 days:
  a customer's orders within a window of d days are Poisson(15 * d / 2406).
* Each order has a uniform number of lineitems in [1 .. 7]; a lineitem passes a query's row filter
  with probability p (derived per query from the spec's distributions).

M is the (1 - 1e-5)-quantile of the customer's matching rows: at SF 1 (150,000 customers) about one
customer expects to have rows cut by it. The quantile is computed exactly (compound Poisson
distribution, by convolution)."""
from __future__ import annotations

import math

ORDERS_PER_CUSTOMER = 15.0  # 1,500,000 / (150,000 * 2/3)
ORDER_DAYS = 2406  # 1992-01-01 .. 1998-08-02
LINES_PER_ORDER = range(1, 8)  # uniform [1 .. 7]
TAIL = 1e-5


def _convolve(a: list[float], b: list[float]) -> list[float]:
    out = [0.0] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        if x:
            for j, y in enumerate(b):
                out[i + j] += x * y
    return out


def _lines_pmf(p: float) -> list[float]:
    """Distribution of the number of an order's lineitems passing a filter of probability p."""
    pmf = [0.0] * (max(LINES_PER_ORDER) + 1)
    for n in LINES_PER_ORDER:
        for j in range(n + 1):
            pmf[j] += math.comb(n, j) * p ** j * (1 - p) ** (n - j) / len(LINES_PER_ORDER)
    return pmf


def orders_in(days: float) -> float:
    """Expected number of a customer's orders dated within a window of ``days`` days."""
    return ORDERS_PER_CUSTOMER * min(days, ORDER_DAYS) / ORDER_DAYS


def quantile(mean_orders: float, p: float | None = 1.0, tail: float = TAIL) -> int:
    """The (1 - tail)-quantile of a customer's rows: its lineitems that pass a filter of probability
    ``p`` among Poisson(mean_orders) orders; ``p=None``: its orders themselves."""
    per_order = [0.0, 1.0] if p is None else _lines_pmf(p)
    total, power, n, weights = [0.0], [1.0], 0, 0.0
    while weights < 1 - 1e-12:  # sum over the number of orders n, until Poisson's tail is negligible
        weight = math.exp(-mean_orders + n * math.log(mean_orders) - math.lgamma(n + 1))
        weights += weight
        total += [0.0] * (len(power) - len(total))
        for i, x in enumerate(power):
            total[i] += weight * x
        power = _convolve(power, per_order)
        n += 1
    cdf = 0.0
    for m, x in enumerate(total):
        cdf += x
        if cdf >= 1 - tail:
            return m
    return len(total) - 1


def large_order_probability(threshold: float = 300, quantity=range(1, 51)) -> float:
    """P[an order's total L_QUANTITY > threshold]: lineitems 1..7, L_QUANTITY uniform [1 .. 50]."""
    prob, pmf = 0.0, [1.0]  # pmf of the quantity sum of the first n lineitems
    q = [0.0] * min(quantity) + [1.0 / len(quantity)] * len(quantity)
    for _ in LINES_PER_ORDER:
        pmf = _convolve(pmf, q)
        prob += sum(x for s, x in enumerate(pmf) if s > threshold) / len(LINES_PER_ORDER)
    return prob


def late_receipt_probability() -> float:
    """P[L_SHIPDATE < L_COMMITDATE < L_RECEIPTDATE] for one lineitem: ship = order + [1 .. 121] days,
    commit = order + [30 .. 90], receipt = ship + [1 .. 30], independent and uniform."""
    hits = sum(1 for ship in range(1, 122) for commit in range(30, 91) for late in range(1, 31)
               if ship < commit < ship + late)
    return hits / (121 * 61 * 30)
