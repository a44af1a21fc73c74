"""The 43 queries of the public ClickBench benchmark, as data (issue 17).

Source: ClickBench, github.com/ClickHouse/ClickBench, `clickhouse/queries.sql` (Apache-2.0), the
public benchmark definition, reproduced query by query in its order (Q0-Q42). Two changes, both
the table's column names: the stored copy of queries.sql writes `Refresh` where the table of
ClickBench's `clickhouse/create.sql` has `IsRefresh` (newer copies of queries.sql write
`IsRefresh` too), and the table is `clickbench.hits`.

Each query carries DPCH's classification: DP-expressible (a differentially private answer to the
same question exists in the controller's model: aggregates with bounded sensitivity per user,
group keys public or released by partition selection) or not, with the reason.
"""
from __future__ import annotations

from dataclasses import dataclass

T = "clickbench.hits"
_DATES = "EventDate >= '2013-07-01' AND EventDate <= '2013-07-31'"


@dataclass(frozen=True)
class Query:
    number: int           # 0-based position in ClickBench's queries.sql
    sql: str
    expressible: bool     # DP-expressible under user-level privacy (UserID), k = 5, M = 100
    reason: str = ""      # why not (empty when expressible)

    @property
    def name(self) -> str:
        return f"Q{self.number}"


# Reasons a query has no DP version.
RAW_ROWS = "returns raw rows (no aggregate): a row of one user is released as is"
BY_UNIT = "groups by UserID, the privacy unit: each group is one user's data"
STRING_MIN = ("MIN of a String column (URL/Title/Referer): returns one row's private text; "
              "a string has no bounds to run the exponential mechanism over")

_SQL = [
    f"SELECT COUNT(*) FROM {T}",
    f"SELECT COUNT(*) FROM {T} WHERE AdvEngineID <> 0",
    f"SELECT SUM(AdvEngineID), COUNT(*), AVG(ResolutionWidth) FROM {T}",
    f"SELECT AVG(UserID) FROM {T}",
    f"SELECT COUNT(DISTINCT UserID) FROM {T}",
    f"SELECT COUNT(DISTINCT SearchPhrase) FROM {T}",
    f"SELECT MIN(EventDate), MAX(EventDate) FROM {T}",
    f"SELECT AdvEngineID, COUNT(*) FROM {T} WHERE AdvEngineID <> 0 GROUP BY AdvEngineID ORDER BY COUNT(*) DESC",
    f"SELECT RegionID, COUNT(DISTINCT UserID) AS u FROM {T} GROUP BY RegionID ORDER BY u DESC LIMIT 10",
    f"SELECT RegionID, SUM(AdvEngineID), COUNT(*) AS c, AVG(ResolutionWidth), COUNT(DISTINCT UserID) FROM {T} "
    "GROUP BY RegionID ORDER BY c DESC LIMIT 10",
    f"SELECT MobilePhoneModel, COUNT(DISTINCT UserID) AS u FROM {T} WHERE MobilePhoneModel <> '' "
    "GROUP BY MobilePhoneModel ORDER BY u DESC LIMIT 10",
    f"SELECT MobilePhone, MobilePhoneModel, COUNT(DISTINCT UserID) AS u FROM {T} WHERE MobilePhoneModel <> '' "
    "GROUP BY MobilePhone, MobilePhoneModel ORDER BY u DESC LIMIT 10",
    f"SELECT SearchPhrase, COUNT(*) AS c FROM {T} WHERE SearchPhrase <> '' GROUP BY SearchPhrase "
    "ORDER BY c DESC LIMIT 10",
    f"SELECT SearchPhrase, COUNT(DISTINCT UserID) AS u FROM {T} WHERE SearchPhrase <> '' GROUP BY SearchPhrase "
    "ORDER BY u DESC LIMIT 10",
    f"SELECT SearchEngineID, SearchPhrase, COUNT(*) AS c FROM {T} WHERE SearchPhrase <> '' "
    "GROUP BY SearchEngineID, SearchPhrase ORDER BY c DESC LIMIT 10",
    f"SELECT UserID, COUNT(*) FROM {T} GROUP BY UserID ORDER BY COUNT(*) DESC LIMIT 10",
    f"SELECT UserID, SearchPhrase, COUNT(*) FROM {T} GROUP BY UserID, SearchPhrase ORDER BY COUNT(*) DESC LIMIT 10",
    f"SELECT UserID, SearchPhrase, COUNT(*) FROM {T} GROUP BY UserID, SearchPhrase LIMIT 10",
    f"SELECT UserID, extract(minute FROM EventTime) AS m, SearchPhrase, COUNT(*) FROM {T} "
    "GROUP BY UserID, m, SearchPhrase ORDER BY COUNT(*) DESC LIMIT 10",
    f"SELECT UserID FROM {T} WHERE UserID = 435090932899640449",
    f"SELECT COUNT(*) FROM {T} WHERE URL LIKE '%google%'",
    f"SELECT SearchPhrase, MIN(URL), COUNT(*) AS c FROM {T} WHERE URL LIKE '%google%' AND SearchPhrase <> '' "
    "GROUP BY SearchPhrase ORDER BY c DESC LIMIT 10",
    f"SELECT SearchPhrase, MIN(URL), MIN(Title), COUNT(*) AS c, COUNT(DISTINCT UserID) FROM {T} "
    "WHERE Title LIKE '%Google%' AND URL NOT LIKE '%.google.%' AND SearchPhrase <> '' "
    "GROUP BY SearchPhrase ORDER BY c DESC LIMIT 10",
    f"SELECT * FROM {T} WHERE URL LIKE '%google%' ORDER BY EventTime LIMIT 10",
    f"SELECT SearchPhrase FROM {T} WHERE SearchPhrase <> '' ORDER BY EventTime LIMIT 10",
    f"SELECT SearchPhrase FROM {T} WHERE SearchPhrase <> '' ORDER BY SearchPhrase LIMIT 10",
    f"SELECT SearchPhrase FROM {T} WHERE SearchPhrase <> '' ORDER BY EventTime, SearchPhrase LIMIT 10",
    f"SELECT CounterID, AVG(length(URL)) AS l, COUNT(*) AS c FROM {T} WHERE URL <> '' GROUP BY CounterID "
    "HAVING COUNT(*) > 100000 ORDER BY l DESC LIMIT 25",
    r"SELECT REGEXP_REPLACE(Referer, '^https?://(?:www\.)?([^/]+)/.*$', '\1') AS k, AVG(length(Referer)) AS l, "
    f"COUNT(*) AS c, MIN(Referer) FROM {T} WHERE Referer <> '' GROUP BY k HAVING COUNT(*) > 100000 "
    "ORDER BY l DESC LIMIT 25",
    "SELECT " + ", ".join(["SUM(ResolutionWidth)"] + [f"SUM(ResolutionWidth + {i})" for i in range(1, 90)])
    + f" FROM {T}",
    f"SELECT SearchEngineID, ClientIP, COUNT(*) AS c, SUM(IsRefresh), AVG(ResolutionWidth) FROM {T} "
    "WHERE SearchPhrase <> '' GROUP BY SearchEngineID, ClientIP ORDER BY c DESC LIMIT 10",
    f"SELECT WatchID, ClientIP, COUNT(*) AS c, SUM(IsRefresh), AVG(ResolutionWidth) FROM {T} "
    "WHERE SearchPhrase <> '' GROUP BY WatchID, ClientIP ORDER BY c DESC LIMIT 10",
    f"SELECT WatchID, ClientIP, COUNT(*) AS c, SUM(IsRefresh), AVG(ResolutionWidth) FROM {T} "
    "GROUP BY WatchID, ClientIP ORDER BY c DESC LIMIT 10",
    f"SELECT URL, COUNT(*) AS c FROM {T} GROUP BY URL ORDER BY c DESC LIMIT 10",
    f"SELECT 1, URL, COUNT(*) AS c FROM {T} GROUP BY 1, URL ORDER BY c DESC LIMIT 10",
    f"SELECT ClientIP, ClientIP - 1, ClientIP - 2, ClientIP - 3, COUNT(*) AS c FROM {T} "
    "GROUP BY ClientIP, ClientIP - 1, ClientIP - 2, ClientIP - 3 ORDER BY c DESC LIMIT 10",
    f"SELECT URL, COUNT(*) AS PageViews FROM {T} WHERE CounterID = 62 AND {_DATES} AND DontCountHits = 0 "
    "AND IsRefresh = 0 AND URL <> '' GROUP BY URL ORDER BY PageViews DESC LIMIT 10",
    f"SELECT Title, COUNT(*) AS PageViews FROM {T} WHERE CounterID = 62 AND {_DATES} AND DontCountHits = 0 "
    "AND IsRefresh = 0 AND Title <> '' GROUP BY Title ORDER BY PageViews DESC LIMIT 10",
    f"SELECT URL, COUNT(*) AS PageViews FROM {T} WHERE CounterID = 62 AND {_DATES} AND IsRefresh = 0 "
    "AND IsLink <> 0 AND IsDownload = 0 GROUP BY URL ORDER BY PageViews DESC LIMIT 10 OFFSET 1000",
    "SELECT TraficSourceID, SearchEngineID, AdvEngineID, CASE WHEN (SearchEngineID = 0 AND AdvEngineID = 0) "
    f"THEN Referer ELSE '' END AS Src, URL AS Dst, COUNT(*) AS PageViews FROM {T} WHERE CounterID = 62 "
    f"AND {_DATES} AND IsRefresh = 0 GROUP BY TraficSourceID, SearchEngineID, AdvEngineID, Src, Dst "
    "ORDER BY PageViews DESC LIMIT 10 OFFSET 1000",
    f"SELECT URLHash, EventDate, COUNT(*) AS PageViews FROM {T} WHERE CounterID = 62 AND {_DATES} "
    "AND IsRefresh = 0 AND TraficSourceID IN (-1, 6) AND RefererHash = 3594120000172545465 "
    "GROUP BY URLHash, EventDate ORDER BY PageViews DESC LIMIT 10 OFFSET 100",
    f"SELECT WindowClientWidth, WindowClientHeight, COUNT(*) AS PageViews FROM {T} WHERE CounterID = 62 "
    f"AND {_DATES} AND IsRefresh = 0 AND DontCountHits = 0 AND URLHash = 2868770270353813622 "
    "GROUP BY WindowClientWidth, WindowClientHeight ORDER BY PageViews DESC LIMIT 10 OFFSET 10000",
    f"SELECT DATE_TRUNC('minute', EventTime) AS M, COUNT(*) AS PageViews FROM {T} WHERE CounterID = 62 "
    "AND EventDate >= '2013-07-14' AND EventDate <= '2013-07-15' AND IsRefresh = 0 AND DontCountHits = 0 "
    "GROUP BY DATE_TRUNC('minute', EventTime) ORDER BY DATE_TRUNC('minute', EventTime) LIMIT 10 OFFSET 1000",
]

_NOT = {
    15: BY_UNIT, 16: BY_UNIT, 17: BY_UNIT, 18: BY_UNIT,
    19: RAW_ROWS + " (and filters on one UserID)",
    21: STRING_MIN, 22: STRING_MIN, 28: STRING_MIN,
    23: RAW_ROWS, 24: RAW_ROWS, 25: RAW_ROWS, 26: RAW_ROWS,
}

QUERIES: tuple[Query, ...] = tuple(
    Query(i, sql, i not in _NOT, _NOT.get(i, "")) for i, sql in enumerate(_SQL))
assert len(QUERIES) == 43
BY_NAME = {q.name: q for q in QUERIES}
