"""Our reader of Nsight Systems SQLite exports: NVTX, kernel, API and projection tables, with SQL.

Every aggregate is computed by SQLite (medians with window functions; kernel categories and API
names through SQL functions registered on the connection), so a trace of millions of rows costs
one pass per table. Definitions follow `nsys stats` (2023.4+):
- `nvtx_sum`: push/pop (59, 70) and start/end (60, 71) ranges; the message from `StringIds` via
  `textId`, else `text`; the domain from the same process's domain-create row (75); an unended
  range ends at the table's last timestamp.
- `cuda_gpu_kern_sum`: kernels by demangled name. `cuda_api_sum`: runtime and driver calls, the
  CUPTI `_vNNNN` suffix dropped as that report drops it (only when it is 6 characters long).
- `nvtx_gpu_proj_sum`: a GPU operation (kernel, memcpy, memset) belongs to every range on the same
  thread that contains the API call that launched it (matched by correlation id in the same
  process); the projection of a range instance spans its first operation's start to its last's end.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from dspark.errors import DSparkError

PROCESS_MASK = -(1 << 24)  # clears the thread bits of a globalTid (0xFFFFFFFFFF000000 as a signed 64-bit integer)
RANGE_TYPES = "(59, 60, 70, 71)"
STYLE = "CASE WHEN eventType IN (59, 70) THEN 'PushPop' ELSE 'StartEnd' END"

# Kernel-name categories, first match wins (attention before GEMM: attention kernels are often
# instantiated inside CUTLASS templates). Names are the demangled ones.
CATEGORIES: list[tuple[str, str]] = [
    ("communication", r"(?i)nccl|cross_device_reduce|custom_ar|all_?reduce|all2all|deep_ep"),
    ("attention", r"flash::|flash_fwd|FlashAttn|fmha|flashinfer|BatchPrefill|BatchDecode|paged_attention|_mla_"
                  r"|_attn|attention|unified_attention|reshape_and_cache"),
    ("GEMM", r"(?i)nvjet|xmma|gemm|gemv|cutlass|cublas|splitKreduce|matmul|s16816"),
    ("norm", r"rms_norm|layer_norm|_norm_|Norm|norm_kernel"),
    ("rotary", r"(?i)rotary|rope"),
    ("activation", r"(?i)act_and_mul|silu|gelu|swiglu"),
    ("softmax/sampling", r"(?i)softmax|argmax|argmin|sort|radix|topk|top_k|multinomial|exponential|sampl"),
    ("reduce", r"(?i)reduce_kernel|reduce|cumsum|scan"),
    ("elementwise", r"(?i)elementwise|vectorized|unrolled|CatArrayBatched|fill|copy|index|where|cast"),
]
MEMORY_CATEGORY = "memcpy/memset"
_COMPILED = [(name, re.compile(pattern)) for name, pattern in CATEGORIES]


def kernel_category(name: str) -> str:
    for category, pattern in _COMPILED:
        if pattern.search(name):
            return category
    return "other"


def api_name(name: str) -> str:
    """The name `cuda_api_sum` prints: a trailing CUPTI version suffix `_vNNNN` (6 characters) dropped."""
    return name[:-6] if len(name) > 6 and name[-6:-4] == "_v" and name[-4:].isdigit() else name


def connect(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise DSparkError(f"{path}: no such trace file")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        conn.execute("SELECT name FROM sqlite_master LIMIT 1").fetchall()
    except sqlite3.DatabaseError as exc:
        raise DSparkError(f"{path}: not an SQLite export ({exc}); export it with "
                          "`nsys export --type sqlite -o FILE.sqlite FILE.nsys-rep`") from None
    conn.create_function("kernel_category", 1, kernel_category, deterministic=True)
    conn.create_function("api_name", 1, api_name, deterministic=True)
    return conn


def _tables(conn) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _columns(conn, table: str) -> set[str]:
    return {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}


def _stats(source: str, keys: list[str], count_name: str = "instances") -> str:
    """SQL: per `keys`, instances, total, avg, median (window functions), min, max and sample stddev
    of `dur` over the rows of `source` (a SELECT with columns keys + dur)."""
    k = ", ".join(keys)
    part = f"PARTITION BY {k}" if keys else ""
    return f"""
    WITH src AS ({source}),
    ranked AS (SELECT *, ROW_NUMBER() OVER ({part} ORDER BY dur) AS rn, COUNT(*) OVER ({part}) AS n FROM src),
    med AS (SELECT {k + ',' if keys else ''} AVG(dur) AS med_ns FROM ranked
            WHERE rn IN ((n + 1) / 2, (n + 2) / 2) {'GROUP BY ' + k if keys else ''})
    SELECT {'s.' + ', s.'.join(keys) + ',' if keys else ''} COUNT(*) AS {count_name}, SUM(s.dur) AS total_ns,
           AVG(s.dur) AS avg_ns, med.med_ns AS med_ns, MIN(s.dur) AS min_ns, MAX(s.dur) AS max_ns,
           CASE WHEN COUNT(*) > 1 THEN SQRT(MAX(0, (SUM(1.0 * s.dur * s.dur) - COUNT(*) * AVG(s.dur) * AVG(s.dur))
                / (COUNT(*) - 1))) ELSE 0.0 END AS stddev_ns
    FROM src s JOIN med ON {' AND '.join(f'med.{c} IS s.{c}' for c in keys) or '1'}
    {'GROUP BY ' + ', '.join('s.' + c for c in keys) if keys else ''}
    ORDER BY total_ns DESC"""


def _rows(conn, sql: str, params: tuple = ()) -> list[dict]:
    cur = conn.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def _ranges_sql(tables: set[str]) -> str:
    """NVTX ranges: id, domain (NULL: default), range, style, globalTid, start, end, dur."""
    strings = "LEFT JOIN StringIds s ON s.id = e.textId" if "StringIds" in tables else ""
    message = "COALESCE(s.value, e.text)" if strings else "e.text"
    return f"""
    SELECT e.rowid AS id, d.text AS domain, {message} AS range, {STYLE.replace('eventType', 'e.eventType')} AS style,
           e.globalTid AS globalTid, e.start AS start,
           COALESCE(e.end, (SELECT MAX(COALESCE(end, start)) FROM NVTX_EVENTS)) AS end,
           COALESCE(e.end, (SELECT MAX(COALESCE(end, start)) FROM NVTX_EVENTS)) - e.start AS dur
    FROM NVTX_EVENTS e {strings}
    LEFT JOIN (SELECT domainId, globalTid & {PROCESS_MASK} AS proc, text FROM NVTX_EVENTS WHERE eventType = 75) d
           ON d.domainId = e.domainId AND d.proc = (e.globalTid & {PROCESS_MASK})
    WHERE e.eventType IN {RANGE_TYPES}"""


def _gpu_ops_sql(conn, tables: set[str]) -> str:
    """Kernels, memcpys and memsets: start, end, correlationId, globalPid, kind."""
    parts = []
    for table, kind in (("CUPTI_ACTIVITY_KIND_KERNEL", "kernel"), ("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"),
                        ("CUPTI_ACTIVITY_KIND_MEMSET", "memset")):
        if table in tables:
            parts.append(f"SELECT start, end, correlationId, globalPid, '{kind}' AS kind FROM {table}")
    return " UNION ALL ".join(parts) or "SELECT 0 AS start, 0 AS end, 0 AS correlationId, 0 AS globalPid, '' AS kind " \
                                        "WHERE 0"


def summarize(path: Path, expect_method: str | None = None) -> dict:
    """The trace's summary (see the module docstring); `expect_method` names a speculative method whose
    `<method>_propose` range must appear."""
    conn = connect(path)
    tables = _tables(conn)
    out: dict = {"file": str(path)}
    out["schema"] = dict(conn.execute("SELECT name, value FROM META_DATA_EXPORT").fetchall()) \
        if "META_DATA_EXPORT" in tables else {}
    capture = dict(conn.execute("SELECT name, value FROM META_DATA_CAPTURE").fetchall()) \
        if "META_DATA_CAPTURE" in tables else {}
    out["capture"] = {k: v for k, v in capture.items()
                      if k in ("TRACE_AFTER_FORK_BEFORE_EXEC",) or k.endswith("CUDA_GRAPH_TRACE_OPTIONS:MODE")}

    has_nvtx = "NVTX_EVENTS" in tables
    if has_nvtx:
        conn.execute(f"CREATE TEMP TABLE ranges AS {_ranges_sql(tables)}")
        conn.execute("CREATE INDEX temp.ranges_tid ON ranges(globalTid, start)")
        out["nvtx"] = _rows(conn, _stats("SELECT domain, range, style, dur FROM ranges", ["domain", "range", "style"]))
    else:
        out["nvtx"] = []

    kernels_sql = ("SELECT s.value AS name, k.end - k.start AS dur FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                   "JOIN StringIds s ON s.id = k.demangledName")
    has_kernels = "CUPTI_ACTIVITY_KIND_KERNEL" in tables
    out["kernels"] = _rows(conn, _stats(kernels_sql, ["name"])) if has_kernels else []
    for row in out["kernels"]:
        row["category"] = kernel_category(row["name"])

    memops = []
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
        label = ("(SELECT label FROM ENUM_CUDA_MEMCPY_OPER WHERE id = m.copyKind)"
                 if "ENUM_CUDA_MEMCPY_OPER" in tables else "m.copyKind")
        memops.append(f"SELECT '[CUDA memcpy ' || {label} || ']' AS name, m.end - m.start AS dur "
                      "FROM CUPTI_ACTIVITY_KIND_MEMCPY m")
    if "CUPTI_ACTIVITY_KIND_MEMSET" in tables:
        memops.append("SELECT '[CUDA memset]' AS name, end - start AS dur FROM CUPTI_ACTIVITY_KIND_MEMSET")
    out["memory_ops"] = _rows(conn, _stats(" UNION ALL ".join(memops), ["name"], "count")) if memops else []

    parts = []
    if has_kernels:
        parts.append(f"SELECT kernel_category(name) AS category, dur FROM ({kernels_sql})")
    if memops:
        parts.append(f"SELECT '{MEMORY_CATEGORY}' AS category, dur FROM ({' UNION ALL '.join(memops)})")
    out["categories"] = _rows(conn, f"""
        WITH ops AS ({' UNION ALL '.join(parts)})
        SELECT category, COUNT(*) AS instances, SUM(dur) AS total_ns,
               1.0 * SUM(dur) / (SELECT SUM(dur) FROM ops) AS share
        FROM ops GROUP BY category ORDER BY total_ns DESC""") if parts else []

    has_api = "CUPTI_ACTIVITY_KIND_RUNTIME" in tables
    out["api"] = [dict(r, calls=r.pop("instances")) for r in _rows(conn, _stats(
        "SELECT api_name(s.value) AS name, r.end - r.start AS dur FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
        "JOIN StringIds s ON s.id = r.nameId", ["name"]))] if has_api else []

    out["projection"], out["busy"] = [], []
    if has_nvtx and has_api:
        conn.execute(f"""CREATE TEMP TABLE launched AS
            SELECT r.globalTid AS globalTid, r.start AS astart, r.end AS aend, g.start AS gstart, g.end AS gend
            FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN ({_gpu_ops_sql(conn, tables)}) g
              ON g.correlationId = r.correlationId AND g.globalPid = (r.globalTid & {PROCESS_MASK})""")
        conn.execute("CREATE INDEX temp.launched_tid ON launched(globalTid, astart)")
        out["projection"] = _rows(conn, """
            WITH per_instance AS (
                SELECT r.id, r.domain, r.range, r.style, r.dur, MIN(l.gstart) AS first, MAX(l.gend) AS last,
                       COUNT(*) AS ops, SUM(l.gend - l.gstart) AS busy
                FROM ranges r JOIN launched l
                  ON l.globalTid = r.globalTid AND l.astart BETWEEN r.start AND r.end AND l.aend <= r.end
                GROUP BY r.id)
            SELECT domain, range, style, COUNT(*) AS range_instances, SUM(dur) AS range_total_ns,
                   SUM(last - first) AS proj_total_ns, SUM(ops) AS gpu_ops, SUM(busy) AS gpu_busy_ns
            FROM per_instance GROUP BY domain, range, style ORDER BY proj_total_ns DESC""")
        out["busy"] = [{"domain": p["domain"], "range": p["range"], "style": p["style"],
                        "gpu_busy_fraction": p["gpu_busy_ns"] / p["range_total_ns"] if p["range_total_ns"] else None}
                       for p in out["projection"]]

    graph_node = has_kernels and "graphNodeId" in _columns(conn, "CUPTI_ACTIVITY_KIND_KERNEL")
    launches = {"kernels": 0, "graph_launches": 0, "kernels_from_graphs_share": None, "graph_trace_rows": 0}
    if has_kernels:
        launches["kernels"], from_graphs = conn.execute(
            f"SELECT COUNT(*), {'COUNT(graphNodeId)' if graph_node else '0'} FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
        launches["kernels_from_graphs_share"] = from_graphs / launches["kernels"] if launches["kernels"] else None
    if has_api:
        launches["graph_launches"] = conn.execute(
            "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
            "WHERE s.value LIKE 'cudaGraphLaunch%' OR s.value LIKE 'cuGraphLaunch%'").fetchone()[0]
    if "CUPTI_ACTIVITY_KIND_GRAPH_TRACE" in tables:
        launches["graph_trace_rows"] = conn.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE").fetchone()[0]
    out["launches"] = launches
    out["processes"] = _processes(conn, tables)
    out["diagnosis"] = diagnose(out, capture, expect_method)
    conn.close()
    return out


def _processes(conn, tables: set[str]) -> list[dict]:
    """Processes seen, with their NVTX, API and GPU-operation row counts."""
    counts = []
    if "NVTX_EVENTS" in tables:
        counts.append(f"SELECT globalTid & {PROCESS_MASK} AS proc, 'nvtx' AS what FROM NVTX_EVENTS")
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        counts.append(f"SELECT globalTid & {PROCESS_MASK} AS proc, 'api' AS what FROM CUPTI_ACTIVITY_KIND_RUNTIME")
    if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
        counts.append("SELECT globalPid AS proc, 'kernels' AS what FROM CUPTI_ACTIVITY_KIND_KERNEL")
    if not counts:
        return []
    rows = _rows(conn, f"""
        WITH c AS ({' UNION ALL '.join(counts)})
        SELECT proc, SUM(what = 'nvtx') AS nvtx_rows, SUM(what = 'api') AS api_rows, SUM(what = 'kernels') AS kernel_rows
        FROM c GROUP BY proc""")
    names = {}
    if "PROCESSES" in tables:
        names = {g: (pid, name) for g, pid, name in conn.execute("SELECT globalPid, pid, name FROM PROCESSES")}
    out = []
    for r in rows:
        pid, name = names.get(r["proc"], ((r["proc"] >> 24) & 0xFFFFFF, None))
        out.append({"pid": pid, "name": name, "nvtx_rows": r["nvtx_rows"], "api_rows": r["api_rows"],
                    "kernel_rows": r["kernel_rows"], "did_gpu_work": r["kernel_rows"] > 0})
    return sorted(out, key=lambda p: -(p["kernel_rows"] + p["nvtx_rows"]))


def diagnose(summary: dict, capture: dict, expect_method: str | None) -> list[str]:
    """Plain sentences for what went wrong in the capture."""
    notes = []
    launches, processes = summary["launches"], summary["processes"]
    forked = capture.get("TRACE_AFTER_FORK_BEFORE_EXEC")
    gpu_ops = launches["kernels"] + launches["graph_trace_rows"] + sum(m["count"] for m in summary["memory_ops"])
    if gpu_ops == 0 and not any(p["api_rows"] for p in processes):
        notes.append("No process in the trace did GPU work: the process that did was not traced. If it was forked "
                     "(a multiprocessing or engine worker), profile with --trace-fork-before-exec=true, or start "
                     "workers with the spawn method." + (" This capture had fork tracing off." if forked == "false"
                                                         else ""))
    for p in processes:
        if p["nvtx_rows"] and p["kernel_rows"] == 0 and (p["api_rows"] or gpu_ops == 0):
            notes.append(f"Process {p['pid']} ({p['name'] or '?'}) left {p['nvtx_rows']} NVTX rows and no kernel rows: "
                         "it likely ended without flushing its CUDA activity buffers, as a multiprocessing fork child "
                         "does. Start it with spawn, or have it stop the profiler (cudaProfilerStop) before it exits.")
    ranges = {r["range"] for r in summary["nvtx"]}
    proposes = {r for r in ranges if r and r.endswith("_propose")}
    if expect_method and f"{expect_method}_propose" not in ranges:
        notes.append(f"The {expect_method}_propose range never appears: the draft did not run its {expect_method} "
                     f"path (seen: {', '.join(sorted(proposes)) or 'no propose range'}); check the draft's format "
                     "and method.")
    elif not expect_method and "target_verify" in ranges and not proposes:
        notes.append("Verify rounds ran but no <method>_propose range appears: the draft did not run its path; "
                     "check its format and method.")
    if launches["graph_trace_rows"] or (launches["graph_launches"] and not launches["kernels_from_graphs_share"]):
        notes.append(f"CUDA graphs were traced whole ({launches['graph_launches']} graph launches, their kernels "
                     "not listed): kernel tables under-count. Profile with --cuda-graph-trace=node.")
    return notes
