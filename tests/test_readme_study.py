"""The README's first screen: the H200 study's measured table at Qwen3-8B shapes is the committed study's c = 1
rows as `study_report.py` wrote them, labelled random weights and synthetic acceptance, its caption naming the
GPU, torch and the revision its run folders record; the CPU demo's table follows with the one sentence on what
it shows; no revision hash stands in the README's prose, only in the figures' blocks."""

import json
import re
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "benchmarks" / "results" / "study_qwen3_8b_h200"
START, END = "<!-- study-table:start -->", "<!-- study-table:end -->"


def readme() -> str:
    return (ROOT / "README.md").read_text()


def study_block() -> str:
    text = readme()
    assert START in text and END in text, f"the README lacks {START} ... {END}"
    return text[text.index(START) + len(START):text.index(END)].strip("\n")


def flat(text: str) -> str:
    return " ".join(text.split())


def test_the_study_table_is_the_committed_studys_c1_rows():
    first = (STUDY / "study.md").read_text().split("\n\n")[1].splitlines()  # the title, then the first table
    header, rows = first[:2], [r for r in first[2:] if r.split("|")[3].strip() == "1"]
    shown = [line for line in study_block().splitlines() if line.startswith("|")]
    assert shown == header + rows  # not edited by hand: the report's own lines
    assert any("| ours | dspark-official | 1 | official-coding | 3.41 | 2.56 |" in r for r in shown)


def test_the_caption_says_what_ran_and_where_it_came_from():
    caption = flat(study_block().split("\n|")[0])
    with tarfile.open(STUDY / "raw.tar.xz", "r:xz") as raw:
        made = json.load(raw.extractfile("native/manifest.json"))["provenance"]
    assert "random weights, synthetic acceptance" in caption and "nothing of any draft's quality" in caption
    assert made["gpu"] in caption and f"torch {made['versions']['torch']}" in caption
    assert f"at git {made['git']['commit']}" in caption and made["time_utc"][:10] in caption
    for script in ("benchmarks/study_h200.sh", "benchmarks/study_report.py"):
        assert script in caption and (ROOT / script).exists()


def test_the_first_screen_holds_both_tables_and_says_why_the_demo_is_not_faster():
    lines = readme().splitlines()
    assert START in lines, f"the README lacks {START}"
    study_at, demo_at = lines.index(START), lines.index("<!-- readme-figures:table:start -->")
    assert study_at < 40 and study_at < demo_at < 60
    above_demo = flat("\n".join(lines[lines.index(END) + 1:demo_at]))
    for says in ("acceptance", "greedy outputs equal to plain decoding's", "end to end", "no speedup",
                 "(docs/demo.md#no-speedup-on-a-cpu-and-why)"):
        assert says in above_demo, says


def test_no_revision_hash_in_the_readmes_prose():
    text = re.sub(r"<!-- (\S+):start -->.*?<!-- \1:end -->", "", readme(), flags=re.S)  # the figures' blocks
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    hashes = [h for h in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"[a-f]", h) and re.search(r"\d", h)]
    assert hashes == []
