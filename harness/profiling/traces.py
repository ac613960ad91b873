"""Our reader of Nsight Systems SQLite exports: NVTX, kernel, API and projection tables, with SQL.

Every row-level aggregate is computed by SQLite: each statistic is read from a per-(name, duration)
histogram (one GROUP BY sort per table), API names come from an SQL function registered on the
connection, and kernel categories are summed from the per-name rows. Definitions follow `nsys stats` (2023.4+):
- `nvtx_sum`: push/pop (59, 70) and start/end (60, 71) ranges; the message from `StringIds` via
  `textId`, else `text`; the domain from the same process's first domain-create row (75) of that id;
  an unended range ends at the last timestamp of any range.
- `cuda_gpu_kern_sum`: kernels by demangled name. `cuda_api_sum`: runtime and driver calls, the
  CUPTI `_vNNNN` suffix dropped as that report drops it (only when it is 6 characters long).
- `nvtx_gpu_proj_sum`: a GPU operation (kernel, memcpy, memset) belongs to every range on the same
  thread that contains the API call that launched it (matched by correlation id in the same
  process); the projection of a range instance spans its first operation's start to its last's end,
  and its GPU ops are the distinct launching calls (a graph launch is one op, however many kernels
  it replays). Ranges that end on another thread are left out, as that report leaves them out.

Exports of Nsight Systems 2023.4 and newer are read; older ones, and SQLite files that are not nsys
exports, are refused.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from dspark.errors import DSparkError

OLDEST = (2023, 4)  # the oldest nsys whose exports we read (year, release)

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
    ("softmax/sampling", r"(?i)softmax|argmax|argmin|sort|radix|topk|top_k|multinomial|exponential|sampl|_accept_"),
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
    if path.stat().st_size == 0:  # (SQLite reads an empty file as an empty database)
        raise DSparkError(f"{path}: the file is empty, not a trace; export the .nsys-rep again with "
                          "`nsys export --type sqlite -o FILE.sqlite FILE.nsys-rep`")
    try:
        conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
        conn.execute("SELECT name FROM sqlite_master LIMIT 1").fetchall()
    except sqlite3.DatabaseError as exc:
        with path.open("rb") as f:
            if f.read(16) == b"SQLite format 3\x00":
                raise DSparkError(f"{path}: corrupt or truncated export ({exc}); export the .nsys-rep again") from None
        raise DSparkError(f"{path}: not an SQLite export ({exc}); export it with "
                          "`nsys export --type sqlite -o FILE.sqlite FILE.nsys-rep`") from None
    conn.create_function("api_name", 1, api_name, deterministic=True)
    return conn


def _tables(conn) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _columns(conn, table: str) -> set[str]:
    return {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}


def _stats(source: str, keys: list[str], count_name: str = "instances") -> str:
    """SQL: per `keys`, instances, total, avg, median, min, max and sample stddev of `dur` over the rows
    of `source` (a SELECT with columns keys + dur).

    The rows are first counted per (keys, duration): GPU timestamps are quantised, so this histogram
    is far smaller than the rows, and the one sort of all rows is the GROUP BY's. Running counts over
    the histogram give the median: the smallest durations whose running count reaches the middle
    position(s), averaged."""
    k = ", ".join(keys)
    return f"""
    WITH src AS ({source}),
    h AS (SELECT {k}, dur, COUNT(*) AS c FROM src GROUP BY {k}, dur),
    cum AS (SELECT {k}, dur, c, SUM(c) OVER (PARTITION BY {k} ORDER BY dur ROWS UNBOUNDED PRECEDING) AS upto,
                   SUM(c) OVER g AS n, SUM(c * dur) OVER g AS total, MIN(dur) OVER g AS low
            FROM h WINDOW g AS (PARTITION BY {k}))
    SELECT {k}, MAX(n) AS {count_name}, MAX(total) AS total_ns, 1.0 * MAX(total) / MAX(n) AS avg_ns,
           (MIN(CASE WHEN upto >= (n + 1) / 2 THEN dur END) + MIN(CASE WHEN upto >= n / 2 + 1 THEN dur END)) / 2.0
               AS med_ns,
           MIN(dur) AS min_ns, MAX(dur) AS max_ns,
           -- sample stddev from deviations about the mean, taken from the group's minimum so that long,
           -- close durations (1e12 ns apart by a few ns) keep their precision
           CASE WHEN MAX(n) > 1 THEN SQRT(SUM(c * ((dur - low) - (1.0 * total / n - low))
                                                  * ((dur - low) - (1.0 * total / n - low))) / (MAX(n) - 1))
                ELSE 0.0 END AS stddev_ns
    FROM cum GROUP BY {k}
    ORDER BY total_ns DESC"""


def _categories(kernels: list[dict], memory_ops: list[dict]) -> list[dict]:
    """Per category: instances, total time and share of all GPU kernel and memory-operation time,
    summed from the per-name aggregates (each name has one category)."""
    groups: dict[str, list[int]] = {}
    for row in kernels:
        g = groups.setdefault(row["category"], [0, 0])
        g[0], g[1] = g[0] + row["instances"], g[1] + row["total_ns"]
    for row in memory_ops:
        g = groups.setdefault(MEMORY_CATEGORY, [0, 0])
        g[0], g[1] = g[0] + row["count"], g[1] + row["total_ns"]
    total = sum(t for _, t in groups.values())
    return sorted(({"category": c, "instances": n, "total_ns": t, "share": t / total if total else None}
                   for c, (n, t) in groups.items()), key=lambda r: -r["total_ns"])


def _named(conn, stats_sql: str, table: str, column: str) -> list[dict]:
    """`_stats` rows grouped by a string id `nid`, with the string (`table`.`column`) as `name`."""
    rows = _rows(conn, f"SELECT n.{column} AS name, t.* FROM ({stats_sql}) t JOIN {table} n ON n.id = t.nid "
                       "ORDER BY t.total_ns DESC")
    for row in rows:
        del row["nid"]
    return rows


def _rows(conn, sql: str, params: tuple = ()) -> list[dict]:
    cur = conn.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def _ranges_sql(tables: set[str], columns: set[str]) -> str:
    """NVTX ranges: id, domain (NULL: default), range, style, globalTid, same_thread (whether it ended on
    the thread that opened it), start, end, dur."""
    strings = "LEFT JOIN StringIds s ON s.id = e.textId" if "StringIds" in tables else ""
    same_thread = "e.endGlobalTid IS NULL" if "endGlobalTid" in columns else "1"
    message = "COALESCE(s.value, e.text)" if strings else "e.text"
    domain_name = ("COALESCE((SELECT value FROM StringIds WHERE id = textId), text)" if strings else "text")
    last = f"(SELECT MAX(MAX(start), COALESCE(MAX(end), 0)) FROM NVTX_EVENTS WHERE eventType IN {RANGE_TYPES})"
    return f"""
    SELECT e.rowid AS id, d.name AS domain, {message} AS range, {STYLE.replace('eventType', 'e.eventType')} AS style,
           e.globalTid AS globalTid, {same_thread} AS same_thread, e.start AS start,
           COALESCE(e.end, {last}) AS end, COALESCE(e.end, {last}) - e.start AS dur
    FROM NVTX_EVENTS e {strings}
    LEFT JOIN (SELECT domainId, globalTid & {PROCESS_MASK} AS proc, {domain_name} AS name, MIN(start)
               FROM NVTX_EVENTS WHERE eventType = 75 GROUP BY domainId, proc) d
           ON d.domainId = e.domainId AND d.proc = (e.globalTid & {PROCESS_MASK})
    WHERE e.eventType IN {RANGE_TYPES}"""


def _gpu_ops_sql(tables: set[str]) -> str:
    """Kernels, memcpys and memsets: start, end, correlationId, globalPid, opid (unique over the three)."""
    parts = []
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        if table in tables:
            parts.append(f"SELECT start, end, correlationId, globalPid, rowid * 4 + {len(parts)} AS opid FROM {table}")
    return " UNION ALL ".join(parts) or "SELECT 0 AS start, 0 AS end, 0 AS correlationId, 0 AS globalPid, 0 AS opid " \
                                        "WHERE 0"


def export_version(path: Path, meta: dict) -> str:
    """The nsys version that wrote the export (`meta`: its META_DATA_EXPORT rows, empty without that
    table); refuses non-nsys files and versions before `OLDEST`."""
    version = meta.get("EXPORT_PRODUCT_VERSION")
    if not isinstance(version, str) or not version.strip():
        raise DSparkError(f"{path}: an SQLite file but not an Nsight Systems export (no META_DATA_EXPORT version); "
                          "export a report with `nsys export --type sqlite`")
    version = version.strip()
    m = re.match(r"(\d+)\.(\d+)", version)
    if not m or (int(m[1]), int(m[2])) < OLDEST:
        raise DSparkError(f"{path}: exported by Nsight Systems {version}, which is not supported (2023.4 and newer "
                          "are); export the .nsys-rep again with a newer nsys")
    return version


def summarize(path: Path | str, expect_method: str | None = None, engine: str | None = None) -> dict:
    """The trace's summary (see the module docstring); `expect_method` names a speculative method whose
    `<method>_propose` range must appear; `engine` "vllm" checks that vLLM's own processes are in it. A corrupt or truncated file raises a one-line DSparkError."""
    try:
        return _summarize(Path(path), expect_method, engine)
    except sqlite3.DatabaseError as exc:
        if "malformed" in str(exc) or "not a database" in str(exc):
            raise DSparkError(f"{path}: corrupt or truncated export ({exc}); export the .nsys-rep again") from None
        raise DSparkError(f"{path}: an export of a layout we cannot read ({exc}); please report it with the "
                          "nsys version that wrote it") from None


def _summarize(path: Path, expect_method: str | None, engine: str | None = None) -> dict:
    conn = connect(path)
    tables = _tables(conn)
    out: dict = {"file": str(path)}
    out["schema"] = dict(conn.execute("SELECT name, value FROM META_DATA_EXPORT").fetchall()) \
        if "META_DATA_EXPORT" in tables else {}
    out["nsys_version"] = export_version(path, out["schema"])
    capture = dict(conn.execute("SELECT name, value FROM META_DATA_CAPTURE").fetchall()) \
        if "META_DATA_CAPTURE" in tables else {}
    out["capture"] = {k: v for k, v in capture.items()
                      if k in ("TRACE_AFTER_FORK_BEFORE_EXEC",) or k.endswith("CUDA_GRAPH_TRACE_OPTIONS:MODE")}

    has_nvtx = "NVTX_EVENTS" in tables
    if has_nvtx:
        # keyed by the event's rowid, so the projection's per-range GROUP BY follows the scan order
        conn.execute("CREATE TEMP TABLE ranges (id INTEGER PRIMARY KEY, domain, range, style, globalTid, same_thread, "
                     "start, end, dur)")
        conn.execute(f"INSERT INTO ranges {_ranges_sql(tables, _columns(conn, 'NVTX_EVENTS'))}")
        out["nvtx"] = _rows(conn, _stats("SELECT domain, range, style, dur FROM ranges", ["domain", "range", "style"]))
    else:
        out["nvtx"] = []

    # kernels and API calls are grouped by their integer string ids; names are joined to the aggregates
    has_kernels = "CUPTI_ACTIVITY_KIND_KERNEL" in tables
    out["kernels"] = _named(conn, _stats("SELECT demangledName AS nid, end - start AS dur "
                                         "FROM CUPTI_ACTIVITY_KIND_KERNEL", ["nid"]),
                            "StringIds", "value") if has_kernels else []
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
    out["categories"] = _categories(out["kernels"], out["memory_ops"])

    has_api = "CUPTI_ACTIVITY_KIND_RUNTIME" in tables
    if has_api:  # names that print alike (one without its CUPTI suffix) share one key, the smallest id
        conn.execute("CREATE TEMP TABLE api_key (id INTEGER PRIMARY KEY, key INTEGER, name TEXT)")
        conn.execute("INSERT INTO api_key SELECT id, MIN(id) OVER (PARTITION BY name), name "
                     "FROM (SELECT id, api_name(value) AS name FROM StringIds)")
        out["api"] = _named(conn, _stats("SELECT m.key AS nid, r.end - r.start AS dur FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
                                         "JOIN api_key m ON m.id = r.nameId", ["nid"], "calls"), "api_key", "name")
    else:
        out["api"] = []

    out["projection"], out["busy"] = [], []
    if has_nvtx and has_api:
        # each GPU operation with the call that launched it, stored in (thread, call start) order
        conn.execute("CREATE TEMP TABLE launched (globalTid INTEGER, astart INTEGER, opid INTEGER, corr INTEGER, "
                     "aend INTEGER, gstart INTEGER, gend INTEGER, PRIMARY KEY (globalTid, astart, opid)) WITHOUT ROWID")
        conn.execute(f"""INSERT INTO launched
            SELECT r.globalTid, r.start, g.opid, r.correlationId, r.end, g.start, g.end
            FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN ({_gpu_ops_sql(tables)}) g
              ON g.correlationId = r.correlationId AND g.globalPid = (r.globalTid & {PROCESS_MASK})""")
        out["projection"] = _rows(conn, """
            WITH per_instance AS (
                SELECT r.id, r.domain, r.range, r.style, r.dur, MIN(l.gstart) AS first, MAX(l.gend) AS last,
                       COUNT(DISTINCT l.corr) AS ops, SUM(l.gend - l.gstart) AS busy
                FROM ranges r JOIN launched l
                  ON l.globalTid = r.globalTid AND l.astart BETWEEN r.start AND r.end AND l.aend <= r.end
                WHERE r.same_thread
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
    out["diagnosis"] = diagnose(out, capture, expect_method, engine)
    conn.close()
    return out


def _count_by(conn, table: str, expr: str) -> dict:
    """Rows of `table` per value of `expr`. A trace has few processes: their values come from a DISTINCT
    (a small temporary index), then one scan counts them all, where a GROUP BY would sort every row."""
    values = [v for (v,) in conn.execute(f"SELECT DISTINCT {expr} FROM {table}")]
    if len(values) > 64:
        return dict(conn.execute(f"SELECT {expr}, COUNT(*) FROM {table} GROUP BY 1").fetchall())
    if not values:
        return {}
    sums = ", ".join(f"SUM({expr} IS ?)" for _ in values)
    return dict(zip(values, conn.execute(f"SELECT {sums} FROM {table}", values).fetchone()))


def _processes(conn, tables: set[str]) -> list[dict]:
    """Processes seen, with their NVTX, API and GPU-operation row counts."""
    per = {"nvtx_rows": ("NVTX_EVENTS", f"globalTid & {PROCESS_MASK}"),
           "api_rows": ("CUPTI_ACTIVITY_KIND_RUNTIME", f"globalTid & {PROCESS_MASK}"),
           "kernel_rows": ("CUPTI_ACTIVITY_KIND_KERNEL", "globalPid")}
    counts = {key: _count_by(conn, table, expr) if table in tables else {} for key, (table, expr) in per.items()}
    procs = sorted({p for c in counts.values() for p in c if p is not None})
    rows = [{"proc": p} | {key: counts[key].get(p, 0) for key in per} for p in procs]
    names = {}
    if "PROCESSES" in tables:
        names = {g: (pid, name) for g, pid, name in conn.execute("SELECT globalPid, pid, name FROM PROCESSES")}
    out = []
    for r in rows:
        pid, name = names.get(r["proc"], ((r["proc"] >> 24) & 0xFFFFFF, None))
        out.append({"pid": pid, "name": name, "nvtx_rows": r["nvtx_rows"], "api_rows": r["api_rows"],
                    "kernel_rows": r["kernel_rows"], "did_gpu_work": r["kernel_rows"] > 0})
    return sorted(out, key=lambda p: -(p["kernel_rows"] + p["nvtx_rows"]))


# where vLLM's engine runs: the processes it starts, named VLLM::EngineCore (which holds the model itself
# when one GPU runs it) and VLLM::Worker...; a trace keeps the kernel's 15 characters of a name
# ("VLLM::EngineCor"), so each is matched by what survives of it after "VLLM::"
VLLM_PROCESSES = ("EngineCore", "Worker")
NAME_CHARS = 15


def vllm_engine_process(name: str | None) -> bool:
    """Whether a traced process is one of vLLM's engine processes, by its possibly truncated name."""
    kept = NAME_CHARS - len("VLLM::")
    return name is not None and any(p[:kept].lower() in name.lower() for p in VLLM_PROCESSES)


def missing_propose(summary: dict, method: str) -> str | None:
    """The sentence saying that `method`'s `<method>_propose` range never appears in a trace summary
    (and which propose ranges do), or None when it appears (`trace summarize --expect-method` fails on it)."""
    ranges = {r["range"] for r in summary["nvtx"] or []}
    if f"{method}_propose" in ranges:
        return None
    seen = ", ".join(sorted(r for r in ranges if r and r.endswith("_propose"))) or "no propose range"
    return (f"The {method}_propose range never appears: the draft did not run its {method} path (seen: {seen}); "
            "check the draft's format and method.")


def diagnose(summary: dict, capture: dict, expect_method: str | None, engine: str | None = None) -> list[str]:
    """Plain sentences for what went wrong in the capture (`engine` "vllm": a trace of vLLM's offline
    engine, whose model runs in processes of its own)."""
    notes = []
    launches, processes = summary["launches"], summary["processes"]
    forked = capture.get("TRACE_AFTER_FORK_BEFORE_EXEC")
    gpu_ops = launches["kernels"] + launches["graph_trace_rows"] + sum(m["count"] for m in summary["memory_ops"] or [])
    if engine == "vllm" and not any(vllm_engine_process(p["name"]) and (p["kernel_rows"] or p["api_rows"])
                                    for p in processes):
        names = ", ".join(p["name"] or "?" for p in processes) or "none"
        notes.append(f"vLLM's engine processes ({' and '.join(VLLM_PROCESSES)}) are not in this trace (processes "
                     f"seen: {names}): vLLM runs the model there. Profile with --trace-fork-before-exec=true and "
                     "start vLLM's workers with spawn (VLLM_WORKER_MULTIPROC_METHOD=spawn), as profile --backend "
                     "vllm does.")
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
    missing = missing_propose(summary, expect_method) if expect_method else None
    if missing:
        notes.append(missing)
    elif not expect_method and "target_verify" in ranges and not proposes:
        notes.append("Verify rounds ran but no <method>_propose range appears: the draft did not run its path; "
                     "check its format and method.")
    # (the share is None where the trace cannot tell, as in a PyTorch profiler trace)
    if launches["graph_trace_rows"] or (launches["graph_launches"] and launches["kernels_from_graphs_share"] == 0):
        notes.append(f"CUDA graphs were traced whole ({launches['graph_launches']} graph launches, their kernels "
                     "not listed): kernel tables under-count. Profile with --cuda-graph-trace=node.")
    return notes
