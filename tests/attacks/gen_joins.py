"""Random join schemas, data and queries for the generative D/D′ test (issue 26, item 7).

A *scenario* is one schema, its data D, one removed unit (the *target*) and a list of queries.
Tables (aliases in every query):

- ``cust c`` (ck, cv, cg, cn): the unit table, privacy unit ``ck``;
- ``ord o`` (ok, ock, ov, og): ``ock`` references ``cust.ck``;
- ``ret r`` (rck, rv): ``rck`` references ``cust.ck`` (a second child: ``o.ock = r.rck`` joins two
  unit columns);
- ``li l`` (lok, lv, lg): ``lok`` references ``ord.ok`` (a grandchild);
- ``nat n`` (nk, nname) and ``pub p`` (pk, plabel): public tables (``pk`` holds unit keys).

Keys are *logical ids* rendered into a column type: 0 is the type's default value (what a LEFT JOIN
miss yields under ``join_use_nulls = 0``), 1…999 ordinary keys, ``EXTREME + j`` the j-th extreme
value of the family (2^64 − 1, 10^17, year 2290, a long string). A reference column and the column
it references are of one family (integers, String, Decimal or DateTime64) but may differ in width,
precision and nullability: a value that the referencing type cannot hold is written as an orphan
id instead, so "same logical id" is exactly "equal in SQL". The rendering is injective per type.

D′ (``neighbour``) is D without the target's ``cust`` row and every row reached from it through
the references (orders and returns whose key is the target's, lineitems whose ``lok`` is the key
of a removed order, duplicated keys included); public tables are unchanged. The duplicated order
keys (``dup_ord``) are inserted after registration, so that referenced keys stop being keys.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from decimal import Decimal

from hypothesis import strategies as st

EXTREME = 1_000_000  # logical ids >= EXTREME are the family's extreme values
ORPHAN = 997  # a logical id no unit or order has
NAT_NAMES = ("n0", "n1", "n2")  # nat has nk 0..2; cust.cn = 3 dangles
PUBLIC_CG = ("a", "b", "c")  # cust.cg's declared public keys (when declared); cg may also be 'z'
SECRET_VALUE = 424242424242  # the target's extreme values (no message may quote them)

FAMILIES = {
    "int": ("UInt64", "Int64", "UInt32", "Int32", "Float64"),
    "str": ("String",),
    "dec": ("Decimal(18, 0)", "Decimal(18, 2)", "Decimal(38, 4)"),
    "dt": ("DateTime64(0, 'UTC')", "DateTime64(3, 'UTC')", "DateTime64(9, 'UTC')"),
}
_INT_EXTREMES = (2**32 - 1, 2**63 - 1, 2**64 - 1)
_DEC_EXTREMES = (10**17, 10**30)
_DT_EXTREMES = ("2290-06-01 00:00:00", "2299-12-31 23:59:59")
_STR_EXTREMES = ("Zorblax" + "x" * 300, "zorblax-" + "\\'" * 3)
_INT_MAX = {"UInt64": 2**64 - 1, "Int64": 2**63 - 1, "UInt32": 2**32 - 1, "Int32": 2**31 - 1, "Float64": 2**53}
VALUE_TYPES = ("Float64", "Int64", "Decimal(18, 2)", "Nullable(Float64)")


@dataclass(frozen=True)
class ColType:
    family: str
    base: str
    nullable: bool = False

    @property
    def sql(self) -> str:
        return f"Nullable({self.base})" if self.nullable else self.base


def _n_extremes(family: str) -> int:
    return {"int": len(_INT_EXTREMES), "dec": len(_DEC_EXTREMES), "dt": len(_DT_EXTREMES),
            "str": len(_STR_EXTREMES)}[family]


def render_key(t: ColType, kid: int | None) -> str | None:
    """The SQL literal of logical id ``kid`` in type ``t`` (NULL for None), or None if ``t`` cannot
    hold it (the caller then writes an orphan id)."""
    if kid is None:
        return "NULL" if t.nullable else None
    ext = kid - EXTREME if kid >= EXTREME else None
    if t.family == "int":
        v = _INT_EXTREMES[ext] if ext is not None else kid
        return str(v) if v <= _INT_MAX[t.base] else None
    if t.family == "str":
        s = _STR_EXTREMES[ext] if ext is not None else ("" if kid == 0 else f"k{kid}")
        return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if t.family == "dec":
        v = _DEC_EXTREMES[ext] if ext is not None else kid
        p, s = (int(x) for x in t.base[len("Decimal("):-1].split(","))
        return str(v) if v < 10 ** (p - s) else None
    if t.family == "dt":
        if ext is not None:
            text = _DT_EXTREMES[ext]
            if t.base.startswith("DateTime64(9") and text >= "2262-04-11":
                return None
            return f"'{text}'"
        if kid == 0:
            return "'1970-01-01 00:00:00'"
        return f"toDateTime64('2000-01-01 00:00:00', 0, 'UTC') + {kid * 3600}"
    raise AssertionError(t)


def render_value(vtype: str, v) -> str:
    if v is None:
        return "NULL" if vtype.startswith("Nullable") else "0"
    if vtype.startswith("Decimal"):
        return str(Decimal(v).quantize(Decimal("0.01")))
    return str(int(v)) if vtype == "Int64" else repr(float(v))


@dataclass(frozen=True)
class Schema:
    ck: ColType
    ock: ColType
    rck: ColType
    pk: ColType
    ok: ColType
    lok: ColType
    vtypes: tuple[str, str, str, str]  # cv, ov, rv, lv
    cg_public: bool  # cust.cg has public keys
    bounds: tuple[tuple[int, int], ...]  # (k, M) of cust, ord, ret, li
    engine: str

    def describe(self) -> str:
        return (f"ck {self.ck.sql}, ock {self.ock.sql}, rck {self.rck.sql}, pk {self.pk.sql}, ok {self.ok.sql}, "
                f"lok {self.lok.sql}, values cv/ov/rv/lv {self.vtypes}, cg public: {self.cg_public}, "
                f"(k, M) cust/ord/ret/li {self.bounds}, engine {self.engine}")


@dataclass
class Data:
    cust: list  # (ck id | None, cv, cg, cn)
    ord: list  # (ok id, ock id | None, ov, og)
    ret: list  # (rck id | None, rv)
    li: list  # (lok id | None, lv, lg)
    pub: list  # (pk id, plabel)
    dup_ord: list  # orders inserted after registration (an existing ok)
    target: int  # the removed unit's ck id

    def neighbour(self) -> "Data":
        """D′: the target and every row reached from it through the references."""
        t = self.target
        gone_orders = {r[0] for r in self.ord + self.dup_ord if r[1] == t}
        keep_ord = lambda rows: [r for r in rows if r[1] != t]  # noqa: E731
        return replace(self, cust=[r for r in self.cust if r[0] != t], ord=keep_ord(self.ord),
                       dup_ord=keep_ord(self.dup_ord), ret=[r for r in self.ret if r[0] != t],
                       li=[r for r in self.li if r[0] is None or r[0] not in gone_orders])

    def summary(self) -> str:
        t = self.target
        mine_o = [r for r in self.ord + self.dup_ord if r[1] == t]
        mine_l = [r for r in self.li if r[0] in {o[0] for o in mine_o}]
        return (f"target ck id {t}; {len(self.cust)} cust, {len(self.ord)} ord (+{len(self.dup_ord)} dup), "
                f"{len(self.ret)} ret, {len(self.li)} li; the target has {len(mine_o)} ord, {len(mine_l)} li")


# ------------------------------------------------------------------------------------------------
# strategies: schema and data
# ------------------------------------------------------------------------------------------------

@st.composite
def col_types(draw, family: str, nullable_p: bool = True) -> ColType:
    return ColType(family, draw(st.sampled_from(FAMILIES[family])), draw(st.booleans()) if nullable_p else False)


@st.composite
def schemas(draw) -> Schema:
    fam_c = draw(st.sampled_from(sorted(FAMILIES)))
    fam_o = draw(st.sampled_from(sorted(FAMILIES)))
    kms = tuple((draw(st.integers(1, 3)), draw(st.integers(1, 8))) for _ in range(4))
    return Schema(
        ck=draw(col_types(fam_c)), ock=draw(col_types(fam_c)), rck=draw(col_types(fam_c)),
        pk=draw(col_types(fam_c)), ok=draw(col_types(fam_o)), lok=draw(col_types(fam_o)),
        vtypes=tuple(draw(st.sampled_from(VALUE_TYPES)) for _ in range(4)),
        cg_public=draw(st.booleans()), bounds=kms, engine=draw(st.sampled_from(("Memory", "MergeTree"))))


def _key_ids(draw, family: str, n: int) -> list[int]:
    """n distinct logical ids: small ones (0 = the default value is likely), maybe one extreme."""
    ids = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n, unique=True))
    if n and draw(st.integers(0, 3)) == 0:
        ids[draw(st.integers(0, n - 1))] = EXTREME + draw(st.integers(0, _n_extremes(family) - 1))
    return ids


def _value(draw, extreme: bool):
    if extreme and draw(st.booleans()):
        return draw(st.sampled_from((SECRET_VALUE, -SECRET_VALUE)))
    if draw(st.integers(0, 9)) == 0:
        return None  # NULL in a Nullable value column, 0 otherwise
    return draw(st.integers(0, 100))


def _fits(t: ColType, kid):
    return kid if render_key(t, kid) is not None else ORPHAN


@st.composite
def datasets(draw, s: Schema) -> Data:
    n_units = draw(st.integers(2, 7))
    units = _key_ids(draw, s.ck.family, n_units)
    units = [u if render_key(s.ck, u) is not None else ORPHAN - 1 - i for i, u in enumerate(units)]
    ti = draw(st.integers(0, n_units - 1))
    target = units[ti]
    heavy = draw(st.booleans())
    cust = [(u, _value(draw, u == target), draw(st.sampled_from(PUBLIC_CG + ("z",))), draw(st.integers(0, 3)))
            for u in units]
    if s.ck.nullable and draw(st.booleans()):
        cust.append((None, draw(st.integers(0, 100)), "a", 0))
    n_orders = [draw(st.integers(0, 3)) if not (heavy and u == target) else draw(st.integers(8, 14)) for u in units]
    ok_ids = _key_ids(draw, s.ok.family, sum(n_orders) + 2)
    ok_ids = [k if render_key(s.ok, k) is not None else 900 + i for i, k in enumerate(ok_ids)]
    ords, pos = [], 0
    for u, n in zip(units, n_orders):
        for _ in range(n):
            ords.append((ok_ids[pos], _fits(s.ock, u), _value(draw, u == target), draw(st.sampled_from("xyz"))))
            pos += 1
    for _ in range(draw(st.integers(0, 2))):  # orphan orders: a missing customer or a NULL key
        ock = None if (s.ock.nullable and draw(st.booleans())) else ORPHAN
        ords.append((ok_ids[pos], ock, draw(st.integers(0, 100)), "x"))
        pos += 1
    ret = [(_fits(s.rck, u), _value(draw, u == target)) for u in units for _ in range(draw(st.integers(0, 2)))]
    li = []
    for o in ords:
        heavy_o = heavy and o[1] == target
        for _ in range(draw(st.integers(0, 6 if heavy_o else 3))):
            li.append((_fits(s.lok, o[0]), _value(draw, o[1] == target), draw(st.sampled_from("pq"))))
    for _ in range(draw(st.integers(0, 2))):  # orphan lineitems
        li.append((None if (s.lok.nullable and draw(st.booleans())) else ORPHAN + 1, draw(st.integers(0, 100)), "p"))
    pub = [(_fits(s.pk, u), f"L{i}") for i, u in enumerate(units) if draw(st.booleans())]
    dup = []
    if ords and draw(st.integers(0, 3)) == 0:  # a referenced key stops being a key
        for _ in range(draw(st.integers(1, 2))):
            o = draw(st.sampled_from(ords))
            owner = draw(st.sampled_from(units))
            dup.append((o[0], _fits(s.ock, owner), draw(st.integers(0, 100)), "y"))
    return Data(cust, ords, ret, li, pub, dup, target)


# ------------------------------------------------------------------------------------------------
# tables
# ------------------------------------------------------------------------------------------------

def _engine(s: Schema, order: str) -> str:
    return "ENGINE = Memory" if s.engine == "Memory" else f"ENGINE = MergeTree ORDER BY {order}"


def create_sql(s: Schema, db: str) -> list[str]:
    cv, ov, rv, lv = s.vtypes
    return [
        f"CREATE TABLE {db}.nat (nk UInt8, nname String) {_engine(s, 'nk')}",
        f"CREATE TABLE {db}.pub (pk {s.pk.sql}, plabel String) {_engine(s, 'tuple()')}",
        f"CREATE TABLE {db}.cust (ck {s.ck.sql}, cv {cv}, cg String, cn UInt8) {_engine(s, 'tuple()')}",
        f"CREATE TABLE {db}.ord (ok {s.ok.sql}, ock {s.ock.sql}, ov {ov}, og String) {_engine(s, 'tuple()')}",
        f"CREATE TABLE {db}.ret (rck {s.rck.sql}, rv {rv}) {_engine(s, 'tuple()')}",
        f"CREATE TABLE {db}.li (lok {s.lok.sql}, lv {lv}, lg String) {_engine(s, 'tuple()')}",
    ]


def insert_sql(s: Schema, d: Data, db: str, *, dups: bool) -> list[str]:
    """INSERT statements of the data (``dups``: the duplicated order keys, inserted after
    registration)."""
    cv, ov, rv, lv = s.vtypes
    out = []

    def ins(table, rows):
        if rows:
            out.append(f"INSERT INTO {db}.{table} VALUES " + ", ".join("(" + ", ".join(r) + ")" for r in rows))

    if dups:  # after registration: duplicated order keys, customers with a NULL key (not a key then)
        ins("cust", [(render_key(s.ck, c[0]), render_value(cv, c[1]), f"'{c[2]}'", str(c[3]))
                     for c in d.cust if c[0] is None])
        ins("ord", [(render_key(s.ok, o[0]), render_key(s.ock, o[1]), render_value(ov, o[2]), f"'{o[3]}'")
                    for o in d.dup_ord])
        return out
    ins("nat", [(str(i), f"'{n}'") for i, n in enumerate(NAT_NAMES)])
    ins("pub", [(render_key(s.pk, p[0]), f"'{p[1]}'") for p in d.pub])
    ins("cust", [(render_key(s.ck, c[0]), render_value(cv, c[1]), f"'{c[2]}'", str(c[3])) for c in d.cust
                 if c[0] is not None])
    ins("ord", [(render_key(s.ok, o[0]), render_key(s.ock, o[1]), render_value(ov, o[2]), f"'{o[3]}'")
                for o in d.ord])
    ins("ret", [(render_key(s.rck, r[0]), render_value(rv, r[1])) for r in d.ret])
    ins("li", [(render_key(s.lok, x[0]), render_value(lv, x[1]), f"'{x[2]}'") for x in d.li])
    return out


def register(db_conn, s: Schema, db: str) -> None:
    """Register the six tables (public ones first, then along the references)."""
    cat = db_conn.catalog
    (kc, mc), (ko, mo), (kr, mr), (kl, ml) = s.bounds
    cat.register(f"{db}.nat", public=True)
    cat.register(f"{db}.pub", public=True)
    cat.register(f"{db}.cust", privacy_unit="ck", bounds={"cv": (0, 100)}, max_groups_contributed=kc,
                 max_rows_per_unit=mc, public_keys={"cg": list(PUBLIC_CG)} if s.cg_public else None)
    cat.register(f"{db}.ord", references={"ock": f"{db}.cust.ck"}, bounds={"ov": (0, 100)},
                 max_groups_contributed=ko, max_rows_per_unit=mo)
    cat.register(f"{db}.ret", references={"rck": f"{db}.cust.ck"}, bounds={"rv": (0, 100)},
                 max_groups_contributed=kr, max_rows_per_unit=mr)
    cat.register(f"{db}.li", references={"lok": f"{db}.ord.ok"}, bounds={"lv": (0, 100)},
                 max_groups_contributed=kl, max_rows_per_unit=ml)


# ------------------------------------------------------------------------------------------------
# queries
# ------------------------------------------------------------------------------------------------

TABLES = {"c": "cust", "o": "ord", "r": "ret", "l": "li", "n": "nat", "p": "pub"}
VALUES = {"c": "cv", "o": "ov", "r": "rv", "l": "lv"}
EDGES = [  # (a, b, equality): protected ⋈ protected along references / unit columns, and public joins
    ("c", "o", "c.ck = o.ock"), ("o", "l", "o.ok = l.lok"), ("c", "r", "c.ck = r.rck"),
    ("o", "r", "o.ock = r.rck"), ("c", "n", "c.cn = n.nk"), ("c", "p", "c.ck = p.pk"),
    ("o", "p", "o.ock = p.pk"), ("r", "p", "r.rck = p.pk"),
]
BAD_EDGES = [("l", "c", "l.lok = c.ck"), ("o", "c", "o.ov = c.cv"), ("l", "r", "l.lok = r.rck")]


@dataclass(frozen=True)
class Query:
    sql: str  # with {db} for the database
    delta: float
    options: tuple = ()  # (name, value) pairs for db.query
    features: tuple = ()

    def text(self, db: str) -> str:
        return self.sql.replace("{db}", db)


@dataclass
class _Q:
    """A query being built: the FROM text, the aliases it defines, WHERE conjuncts, features."""

    aliases: list = field(default_factory=list)
    from_sql: str = ""
    with_sql: list = field(default_factory=list)
    where: list = field(default_factory=list)
    features: list = field(default_factory=list)
    extra_values: dict = field(default_factory=dict)  # alias -> value columns (per-unit subqueries)
    private_keys: list = field(default_factory=list)


def _source(draw, a: str, q: _Q, allow_sub: bool) -> str:
    """``{db}.table a``, or a row-level subquery / CTE over the table (features 'subquery', 'cte')."""
    t = TABLES[a]
    how = draw(st.sampled_from(("table",) * 5 + ("subquery", "cte"))) if allow_sub and a in VALUES else "table"
    if how == "table":
        return f"{{db}}.{t} {a}"
    v = VALUES[a]
    cols = {"c": "ck, cv, cg, cn", "o": "ok, ock, ov, og", "r": "rck, rv", "l": "lok, lv, lg"}[a]
    body = f"SELECT {cols} FROM {{db}}.{t} WHERE {v} < {draw(st.integers(10, 101))}"
    q.features.append(how)
    if how == "subquery":
        return f"({body}) {a}"
    q.with_sql.append(f"{a}_cte AS ({body})")
    return f"{a}_cte {a}"


def _join_tree(draw, q: _Q) -> None:
    start = draw(st.sampled_from(("c", "o", "r", "l")))
    q.aliases = [start]
    steps = draw(st.integers(0, 3))
    edges = []
    for _ in range(steps):
        pool = [e for e in EDGES if (e[0] in q.aliases) != (e[1] in q.aliases)]
        if draw(st.integers(0, 15)) == 0:
            pool += [e for e in BAD_EDGES if (e[0] in q.aliases) != (e[1] in q.aliases)]
        if not pool:
            break
        e = draw(st.sampled_from(pool))
        new = e[1] if e[0] in q.aliases else e[0]
        q.aliases.append(new)
        edges.append((new, e[2]))
    style = draw(st.sampled_from(("join", "join", "comma", "cross")))
    parts = [_source(draw, start, q, True)]
    if style in ("comma", "cross") and edges:  # the equalities in WHERE connect the tables
        q.features.append(style)
        parts += [_source(draw, a, q, False) for a, _ in edges]
        q.from_sql = (", " if style == "comma" else " CROSS JOIN ").join(parts)
        q.where += [cond for _, cond in edges]
        return
    text = parts[0]
    for a, cond in edges:
        kind = draw(st.sampled_from(("JOIN", "JOIN", "LEFT JOIN")))
        q.features.append("left" if kind == "LEFT JOIN" else "inner")
        on = cond
        if kind == "LEFT JOIN" and a in VALUES and draw(st.booleans()):
            on += f" AND {a}.{VALUES[a]} < {draw(st.integers(10, 90))}"
        text += f" {kind} {_source(draw, a, q, kind == 'JOIN')} ON {on}"
    q.from_sql = text


def _per_unit(draw, q: _Q) -> None:
    """A per-unit pre-aggregation (GROUP BY a unit-determining column) as FROM, maybe joined."""
    shape = draw(st.integers(0, 4))
    having = draw(st.sampled_from(("", "", f" HAVING COUNT(*) > {draw(st.integers(0, 2))}", " HAVING SUM({v}) > 50",
                                   " HAVING MAX({v}) / (COUNT(*) - 2) > 1", " HAVING MAX({v}) * 100000000 > 1")))
    where = draw(st.sampled_from(("", f" WHERE ov < {draw(st.integers(10, 90))}", " WHERE ov * 100000000 > 1")))
    q.features.append(f"per_unit{shape}")
    if shape == 0:  # per customer over its orders, joined back to the customer
        body = f"SELECT ock, COUNT(*) AS cnt, SUM(ov) AS sv FROM {{db}}.ord{where} GROUP BY ock{having.format(v='ov')}"
        join = draw(st.booleans())
        q.aliases = ["t", "c"] if join else ["t"]
        q.from_sql = f"({body}) t" + (" JOIN {db}.cust c ON c.ck = t.ock" if join else "")
        if join and draw(st.booleans()):
            q.aliases.append("n")
            q.from_sql += " JOIN {db}.nat n ON c.cn = n.nk"
    elif shape == 1:  # TPC-H Q13: a LEFT JOIN counted per customer
        on = f" AND ov < {draw(st.integers(10, 90))}" if draw(st.booleans()) else ""
        body = (f"SELECT ck, COUNT(ok) AS cnt FROM {{db}}.cust LEFT JOIN {{db}}.ord ON ck = ock{on} "
                f"GROUP BY ck{having.format(v='cv')}")
        q.aliases = ["t"]
        q.from_sql = f"({body}) t"
    elif shape == 2:  # per order over its lineitems, joined to the order
        body = f"SELECT lok, COUNT(*) AS cnt, MAX(lv) AS mx FROM {{db}}.li GROUP BY lok{having.format(v='lv')}"
        join = draw(st.booleans())  # joined to the order: refused today (docs/CONTROLLER.md "Joins")
        q.aliases = ["t", "o"] if join else ["t"]
        q.from_sql = f"({body}) t" + (" JOIN {db}.ord o ON o.ok = t.lok" if join else "")
        if draw(st.booleans()):
            q.where.append(f"t.mx > {draw(st.integers(0, 100))}")
    elif shape == 3:  # the unit output taken from the LEFT side of a LEFT JOIN
        body = "SELECT o.ock AS u, COUNT(*) AS cnt FROM {db}.cust c LEFT JOIN {db}.ord o ON c.ck = o.ock GROUP BY o.ock"
        q.aliases = ["t"]
        q.from_sql = f"({body}) t"
    else:  # a per-unit CTE joined to the customer and its returns
        q.with_sql.append(f"t AS (SELECT ock, COUNT(*) AS cnt FROM {{db}}.ord{where} "
                          f"GROUP BY ock{having.format(v='ov')})")
        q.aliases = ["t", "c"]
        q.from_sql = "t JOIN {db}.cust c ON c.ck = t.ock"
        if draw(st.booleans()):
            q.aliases.append("r")
            q.from_sql += f" {draw(st.sampled_from(('JOIN', 'LEFT JOIN')))} {{db}}.ret r ON r.rck = c.ck"
    q.private_keys.append("t.cnt")


def _semi_joins(draw, q: _Q) -> None:
    a = set(q.aliases)
    pool = []
    lim = draw(st.integers(0, 100))
    neg = draw(st.sampled_from(("", "NOT ")))
    if "o" in a:
        pool += [f"o.ok {neg}IN (SELECT lok FROM {{db}}.li WHERE lv > {lim})",
                 f"{neg}EXISTS (SELECT * FROM {{db}}.li WHERE lok = o.ok AND lv > {lim})",
                 f"o.ok {neg}IN (SELECT lok FROM {{db}}.li GROUP BY lok HAVING SUM(lv) > {lim})",
                 f"o.ok IN (SELECT lok FROM {{db}}.li GROUP BY lok HAVING MAX(lv) / (COUNT(*) - 2) > 1)",
                 f"o.ock {neg}IN (SELECT ck FROM {{db}}.cust WHERE cv > {lim})",
                 f"o.ock {neg}IN (SELECT rck FROM {{db}}.ret)",
                 f"o.ock {neg}IN (SELECT pk FROM {{db}}.pub)",
                 f"o.ok IN (SELECT lok FROM {{db}}.li GROUP BY lok HAVING MAX(lv) * 100000000 > {lim})",
                 f"o.ok {neg}IN (SELECT lok FROM {{db}}.li WHERE lv * 100000000 > {lim})",
                 f"{neg}EXISTS (SELECT * FROM {{db}}.ret WHERE rck = o.ock AND rv > {lim})"]
    if "c" in a:
        pool += [f"c.ck {neg}IN (SELECT ock FROM {{db}}.ord WHERE ov > {lim})",
                 f"{neg}EXISTS (SELECT * FROM {{db}}.ord WHERE ock = c.ck AND ov < {lim})",
                 f"c.cn {neg}IN (SELECT nk FROM {{db}}.nat WHERE nname = 'n1')",
                 f"c.ck {neg}IN (SELECT pk FROM {{db}}.pub)"]
    if "l" in a:
        pool += [f"l.lok {neg}IN (SELECT ok FROM {{db}}.ord WHERE ov < {lim})"]
    if "r" in a:
        pool += [f"{neg}EXISTS (SELECT * FROM {{db}}.cust WHERE ck = r.rck AND cv > {lim})"]
    if pool and draw(st.integers(0, 2)) == 0:
        cond = draw(st.sampled_from(pool))
        q.where.append(cond)
        q.features.append(("not_" if neg else "") + ("exists" if "EXISTS" in cond else "in") +
                          ("_public" if ("pub" in cond or "nat" in cond) else ""))


@st.composite
def queries(draw) -> Query:
    q = _Q()
    if draw(st.integers(0, 4)) == 0:
        _per_unit(draw, q)
    else:
        _join_tree(draw, q)
    _semi_joins(draw, q)
    vals = [f"{a}.{VALUES[a]}" for a in q.aliases if a in VALUES]
    if vals and draw(st.booleans()):
        scale = draw(st.sampled_from(("", "", "", " * 100000000")))  # Decimal arithmetic may overflow
        q.where.append(f"{draw(st.sampled_from(vals))}{scale} {draw(st.sampled_from(('<', '>')))} "
                       f"{draw(st.integers(0, 100))}")
    # GROUP BY: public keys (cust.cg when declared, nat.nname, pub.plabel) or private ones
    keys = []
    cands = [k for k, al in (("c.cg", "c"), ("n.nname", "n"), ("p.plabel", "p"), ("o.og", "o"), ("l.lg", "l"))
             if al in q.aliases] + [k for k in q.private_keys]
    if cands and draw(st.booleans()):
        keys = draw(st.lists(st.sampled_from(cands), min_size=1, max_size=2, unique=True))
    aggs = ["COUNT(*)"]
    for _ in range(draw(st.integers(0, 2))):
        if vals:
            v = draw(st.sampled_from(vals))
            aggs.append(draw(st.sampled_from((f"COUNT({v})", f"SUM({v})", f"AVG({v})", f"SUM({v} * 2 - 10)"))))
    if draw(st.integers(0, 3)) == 0 and len(aggs) > 1:
        aggs = aggs[1:]
    select = [f"{k} AS g{i}" for i, k in enumerate(keys)] + [f"{a} AS a{i}" for i, a in enumerate(aggs)]
    sql = ""
    if q.with_sql:
        sql = "WITH " + ", ".join(q.with_sql) + " "
    sql += f"SELECT {', '.join(select)} FROM {q.from_sql}"
    if q.where:
        sql += " WHERE " + " AND ".join(q.where)
    if keys:
        sql += " GROUP BY " + ", ".join(f"g{i}" for i in range(len(keys)))
        q.features.append("group_" + "_".join(k.split(".")[1] for k in keys))
    delta = draw(st.sampled_from((1e-6, 1e-6, 0.0))) if keys else 0.0
    options = ()
    if draw(st.integers(0, 4)) == 0:
        options = (("max_rows_per_unit", draw(st.integers(1, 5))), ("max_groups_contributed", draw(st.integers(1, 3))))
    return Query(sql, delta, options, tuple(q.features))


@dataclass(frozen=True)
class Scenario:
    schema: Schema
    data: Data
    queries: tuple

    def __repr__(self) -> str:  # what hypothesis prints for a failing example
        qs = "\n  ".join(q.sql for q in self.queries)
        return f"Scenario(\n schema: {self.schema.describe()}\n data: {self.data}\n queries:\n  {qs})"


def scenarios(min_queries: int, max_queries: int):
    @st.composite
    def _s(draw):
        s = draw(schemas())
        qs = draw(st.lists(queries(), min_size=min_queries, max_size=max_queries))
        return Scenario(s, draw(datasets(s)), tuple(qs))
    return _s()
