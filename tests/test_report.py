"""The HTML report: its sections for GPU and CPU runs, escaping of hostile names, re-rendering from
summary.json with and without traces, the timeline's merging of sub-pixel events, size and speed on
the real A100 trace, and the `perfscope report` command."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import time

import orjson
import pytest

import perfscope
from perfscope.record import load_summary, write_summary
from perfscope.record.view import record_of
from perfscope.reports import render_report
from perfscope.testing import ContractError
from perfscope.testing.sections import check_section, check_sections
from test_bad_input import assert_one_line_error, run_cli
from tracegen import annotation, cpu_op, dataloader, kernel, launch, memcpy, runtime, step, write_trace
from conftest import HANG_TIMEOUT_S  # noqa: E402

EVIL_KERNEL = "</script><script>alert(1)</script>"
EVIL_FILE = "<img src=x onerror=alert(1)>"
GPU_SECTIONS = ("verdict", "steps", "timeline", "gaps", "kernels", "operators", "launch", "memcpy", "memory", "telemetry", "ranks",
                "quality", "facts")


def gpu_trace(path, steps=3, kernel_name="gemm", dl_us=50, kernel_us=600, rank=None):
    """Steps of 1000 us: a DataLoader fetch of ``dl_us``, a kernel of ``kernel_us`` and a pageable H2D copy."""
    events = []
    for i in range(steps):
        t0 = 1000 * i
        events += [
            step(i + 1, t0, 1000),
            dataloader(t0 + 1, dl_us),
            cpu_op("aten::mm", t0 + dl_us + 5, 100),
            *launch(kernel_name, t0 + dl_us + 10, t0 + dl_us + 20, kernel_us, correlation=10 * i + 1),
            runtime("cudaMemcpyAsync", t0 + dl_us + 12, 4, correlation=10 * i + 2),
            memcpy("Memcpy HtoD (Pageable -> Device)", t0 + dl_us + 30 + kernel_us, 20, correlation=10 * i + 2),
        ]
    meta = {"distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2}} if rank is not None else {}
    return write_trace(path, events, **meta)


def cpu_trace(path, steps=3):
    events = []
    for i in range(steps):
        t0 = 1000 * i
        events += [step(i + 1, t0, 1000), dataloader(t0 + 1, 300), cpu_op("aten::addmm", t0 + 350, 500),
                   annotation("gloo:all_reduce", t0 + 860, 100, tid=7)]
    return write_trace(path, events)


def sections(html: str) -> list[str]:
    return re.findall(r'<section id="([a-z]+)">', html)


def assert_self_contained(html: str):
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    assert not re.search(r"<script", html, re.IGNORECASE)
    assert not re.search(r"<(img|iframe|object|embed|link rel=\"stylesheet\")", html, re.IGNORECASE)
    # no reference to anything outside the page (the SVG namespace is a name, not a request)
    for ref in re.findall(r'(?:src|href)="([^"]*)"', html):
        assert ref.startswith(("#", "data:")), ref
    # ids are unique in the page (several charts, each with its clip paths and markers), and the only
    # url() is a reference to one of them
    ids = re.findall(r'\bid="([^"]+)"', html)
    assert len(ids) == len(set(ids)), sorted(i for i in set(ids) if ids.count(i) > 1)
    for ref in re.findall(r"url\(([^)]*)\)", html):
        assert ref.startswith("#") and ref[1:] in ids, ref
    for ref in re.findall(r'href="#([^"]*)"', html):
        assert ref in ids, ref
    assert "@import" not in html


# ---------------------------------------------------------------------------------------------
# Sections


def test_gpu_report_has_every_section_verdict_first(tmp_path):
    summary = perfscope.analyze(gpu_trace(tmp_path / "t.json")).summary()
    html = render_report(summary, base_dir=tmp_path)
    assert sections(html) == list(GPU_SECTIONS)
    assert_self_contained(html)
    v = summary["overall"]["verdict"]
    assert f"<strong>{v}</strong>" in html
    assert "would cut the step time from" in html and "upper bound" in html
    assert "pageable" in html  # the pageable copy is called out
    assert "<svg" in html.split('id="timeline"')[1].split("</section>")[0]  # the timeline was drawn
    assert "step time (ms)" in html and "time since the step started (ms)" in html  # axis units
    assert "<figcaption>" in html and "<th" in html


def nav_links(html: str) -> list[str]:
    return re.findall(r'<a href="#([a-z]+)">', html.split("</nav>")[0])


@pytest.mark.parametrize("make", [gpu_trace, cpu_trace])
def test_the_nav_and_the_body_come_from_one_list_of_sections(tmp_path, make, monkeypatch):
    from perfscope.reports import bottleneck

    summary = perfscope.analyze(make(tmp_path / "t.json")).summary()
    shown = [s.anchor for s in bottleneck.SECTIONS if s.shows(record_of(summary))]
    check_sections(bottleneck.SECTIONS, summary)  # the contract suite, on every shipped section
    html = render_report(summary, base_dir=tmp_path)
    assert nav_links(html) == sections(html) == shown
    with pytest.raises(ContractError, match="renders sections"):
        check_section(bottleneck.Section("broken", lambda s: "Broken", lambda s, t: ""), summary)
    # a section added to the list is in both; one whose renderer writes no section of its anchor fails
    extra = bottleneck.Section("extra", lambda s: "Extra", lambda s, t: '<section id="extra"><h2>x</h2></section>')
    monkeypatch.setattr(bottleneck, "SECTIONS", (*bottleneck.SECTIONS, extra))
    html = render_report(summary, base_dir=tmp_path)
    assert nav_links(html) == sections(html) == [*shown, "extra"]
    broken = bottleneck.Section("broken", lambda s: "Broken", lambda s, t: "")
    monkeypatch.setattr(bottleneck, "SECTIONS", (*bottleneck.SECTIONS, broken))
    html = render_report(summary, base_dir=tmp_path)
    assert nav_links(html) != sections(html)


def test_cpu_report_has_its_sections(tmp_path):
    summary = perfscope.analyze(cpu_trace(tmp_path / "c.json")).summary()
    assert summary["mode"] == "cpu"
    html = render_report(summary, base_dir=tmp_path)
    assert sections(html) == [s for s in GPU_SECTIONS if s != "telemetry"]  # no GPU: no telemetry section
    assert "Top operators" in html and "aten::addmm" in html
    assert "CPU-only run" in html
    assert "framework overhead" in html and "DataLoader" in html
    assert_self_contained(html)


def test_summary_without_details_still_renders(tmp_path):
    summary = perfscope.analyze(gpu_trace(tmp_path / "t.json")).summary()
    del summary["details"]
    html = render_report(summary, find_traces=False)
    assert sections(html) == list(GPU_SECTIONS)
    assert "no details section" in html
    assert "would cut the step time from" in html  # what-if computed from the steps


def test_ranks_section_highlights_the_slowest(tmp_path):
    (tmp_path / "d").mkdir()
    gpu_trace(tmp_path / "d" / "rank0.json", rank=0, kernel_us=400)
    gpu_trace(tmp_path / "d" / "rank1.json", rank=1, kernel_us=700)
    html = render_report(perfscope.analyze(tmp_path / "d").summary(), base_dir=tmp_path)
    ranks = html.split('id="ranks"')[1].split("</section>")[0]
    assert "Rank 1 is the slowest" in ranks
    assert '<tr class="hl"><td class="l">1 (slowest)' in ranks
    assert "wait for it in collectives" in ranks


# ---------------------------------------------------------------------------------------------
# Hostile names


def test_hostile_kernel_and_file_names_are_escaped(tmp_path):
    trace = gpu_trace(tmp_path / f"{EVIL_FILE}.json", kernel_name=EVIL_KERNEL)
    r = run_cli(tmp_path, "analyze", trace, "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    html = (tmp_path / "out" / "report.html").read_text()
    assert_self_contained(html)
    assert "&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in html  # shown, as text
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "<img" not in html


def _hostile(value: str, summary: dict) -> dict:
    s = copy.deepcopy(summary)
    s["run"].update(script=value, args=[value, "--x"], cwd=value, host=value, error=value, extra_field=value)
    s["notes"] = [value]
    s["warnings"] = [value]
    s["traces"][0]["path"] = value
    s["traces"][0]["devices"] = [value]
    s["generated_at"] = value
    d = s["details"]
    d["top_kernels"][0]["name"] = value
    d["memcpy"][0]["direction"] = value
    for row in s["steps"]:
        row["worker"] = value
    return s


def test_every_string_of_a_hand_made_summary_is_escaped(tmp_path):
    summary = perfscope.analyze(gpu_trace(tmp_path / "t.json")).summary()
    for value in (EVIL_KERNEL, EVIL_FILE, '"><svg onload=alert(1)>', "' onmouseover='alert(1)"):
        html = render_report(_hostile(value, summary), find_traces=False)
        assert_self_contained(html)
        assert "<svg onload" not in html and "onmouseover='" not in html


# ---------------------------------------------------------------------------------------------
# Re-rendering


def test_report_command_re_renders_with_and_without_traces(tmp_path):
    trace = gpu_trace(tmp_path / "t.json")
    out = tmp_path / "out"
    assert run_cli(tmp_path, "analyze", trace, "--out", out).returncode == 0
    (out / "report.html").unlink()
    r = run_cli(tmp_path, "report", out)
    assert r.returncode == 0, r.stderr
    html = (out / "report.html").read_text()
    assert 'id="tl0"' in html  # the timeline, from the recorded trace path

    trace.unlink()  # the output folder alone: the timeline is drawn from timeline.json, as before
    r = run_cli(tmp_path, "report", out / "summary.json", "--out", tmp_path / "again.html")
    assert r.returncode == 0, r.stderr
    again = (tmp_path / "again.html").read_text()
    assert sections(again) == list(GPU_SECTIONS)
    assert _timeline(again) == _timeline(html)

    (out / "timeline.json").unlink()  # the summary alone
    r = run_cli(tmp_path, "report", out / "summary.json", "--out", tmp_path / "alone.html")
    assert r.returncode == 0, r.stderr
    alone = (tmp_path / "alone.html").read_text()
    assert sections(alone) == list(GPU_SECTIONS)
    assert "The timeline needs the trace files" in alone
    assert 'id="tl0"' not in alone


def test_a_saved_output_folder_renders_its_timeline_with_the_traces_deleted(tmp_path):
    out = tmp_path / "out"
    trace = gpu_trace(tmp_path / "t.json", steps=5)
    assert run_cli(tmp_path, "analyze", trace, "--out", out).returncode == 0
    first = _timeline((out / "report.html").read_text())
    trace.unlink()
    (out / "report.html").unlink()
    r = run_cli(tmp_path, "report", out)
    assert r.returncode == 0, r.stderr
    assert _timeline((out / "report.html").read_text()) == first  # every pre-rendered step, as drawn at first
    assert "<svg" in first and 'id="tl1"' in first

    # a stored step is chosen from the record; one it lacks needs the traces, and the note says so
    r = run_cli(tmp_path, "report", out, "--step", "4", "--out", tmp_path / "s4.html")
    assert r.returncode == 0, r.stderr
    assert re.search(r'id="tl\d+" checked><label[^>]*>step 4', (tmp_path / "s4.html").read_text())

    # a timeline.json of another summary is not drawn as this one's
    other = tmp_path / "other"
    assert run_cli(tmp_path, "analyze", gpu_trace(tmp_path / "u.json", steps=4), "--out", other).returncode == 0
    (out / "timeline.json").write_bytes((other / "timeline.json").read_bytes())
    r = run_cli(tmp_path, "report", out, "--out", tmp_path / "mixed.html")
    assert r.returncode == 0, r.stderr
    assert "belongs to another summary" in r.stderr
    assert 'id="tl0"' not in (tmp_path / "mixed.html").read_text()

    (out / "timeline.json").write_text("{not json")  # damaged: one warning line, the rest renders
    r = run_cli(tmp_path, "report", out, "--out", tmp_path / "damaged.html")
    assert r.returncode == 0, r.stderr
    assert "malformed timeline record" in r.stderr and "Traceback" not in r.stderr


def test_traces_in_the_out_dir_are_found_after_a_move(tmp_path):
    (tmp_path / "run" / "traces").mkdir(parents=True)
    trace = gpu_trace(tmp_path / "run" / "traces" / "rank0.json")
    summary = perfscope.analyze(trace).summary()
    write_summary(summary, tmp_path / "run" / "summary.json")
    (tmp_path / "run").rename(tmp_path / "moved")
    r = run_cli(tmp_path, "report", tmp_path / "moved")
    assert r.returncode == 0, r.stderr
    assert 'id="tl0"' in (tmp_path / "moved" / "report.html").read_text()


def test_step_option_selects_the_timeline_step(tmp_path):
    out = tmp_path / "out"
    assert run_cli(tmp_path, "analyze", gpu_trace(tmp_path / "t.json", steps=5), "--out", out).returncode == 0
    r = run_cli(tmp_path, "report", out, "--step", "4", "--out", tmp_path / "s4.html")
    assert r.returncode == 0, r.stderr
    html = (tmp_path / "s4.html").read_text()
    checked = re.search(r'<input type="radio" name="tl" id="tl\d+" checked><label[^>]*>([^<]*)', html)
    assert checked and checked.group(1).startswith("step 4")
    default = (out / "report.html").read_text()
    assert re.search(r'checked><label[^>]*>step \d+ \(representative\)', default)


def _file(path, text):
    path.write_text(text)
    return path


def _dir(path):
    path.mkdir()
    return path


@pytest.mark.parametrize("make, message", [
    (lambda t: t / "missing", "no such file"),
    (lambda t: _dir(t / "empty"), "no summary.json"),
    (lambda t: _file(t / "x.json", "{not json"), "not valid JSON"),
    (lambda t: _file(t / "y.json", '{"a": 1}'), "not a perfscope summary"),
    (lambda t: _file(t / "z.json", '{"schema": "perfscope.summary", "schema_version": 1}'), "lacks its steps"),
])
def test_report_bad_input_is_one_line_error(tmp_path, make, message):
    r = run_cli(tmp_path, "report", make(tmp_path))
    assert_one_line_error(r)
    assert message in r.stderr


def test_report_unknown_step_is_one_line_error(tmp_path):
    out = tmp_path / "out"
    assert run_cli(tmp_path, "analyze", gpu_trace(tmp_path / "t.json"), "--out", out).returncode == 0
    r = run_cli(tmp_path, "report", out, "--step", "99")
    assert_one_line_error(r)
    assert "--step 99 is not a step of this run (steps 1-3)" in r.stderr


def test_open_never_fails_the_command(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "BROWSER": "false"}  # a "browser" that fails
    r = subprocess.run([sys.executable, "-m", "perfscope", "analyze", str(gpu_trace(tmp_path / "t.json")), "--out",
                        str(out), "--open"], cwd=tmp_path, capture_output=True, text=True, timeout=HANG_TIMEOUT_S, env=env)
    assert r.returncode == 0, r.stderr
    assert "could not open a web browser" in r.stderr
    env["BROWSER"] = "true"
    r = subprocess.run([sys.executable, "-m", "perfscope", "report", str(out), "--open"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=HANG_TIMEOUT_S, env=env)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_importing_perfscope_and_reports_loads_no_plotting_library():
    code = "import sys, perfscope, perfscope.cli, reports; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------
# The timeline stays small


def _timeline(html: str) -> str:
    return html.split('id="timeline"')[1].split("</section>")[0]


def test_timeline_merges_events_narrower_than_a_pixel(tmp_path):
    # one 20 ms step with 20,000 kernels of 0.5 us, 0.5 us apart: far more than the 1,000 columns
    events = [step(1, 0, 20_000)]
    for k in range(20_000):
        events += [runtime("cudaLaunchKernel", k, 0.2, correlation=k + 1), kernel(f"k{k % 7}", k + 0.25, 0.5, correlation=k + 1)]
    summary = perfscope.analyze(write_trace(tmp_path / "many.json", events)).summary()
    html = render_report(summary, base_dir=tmp_path)
    tl = _timeline(html)
    assert "<svg" in tl
    assert tl.count("<rect") < 200  # a handful of runs, not 20,000 rectangles
    assert "20000 GPU events" in tl or "GPU events in" in tl  # the merged run says how many it holds


@pytest.fixture(scope="module")
def a100_report(shared_traces, tmp_path_factory):
    out = tmp_path_factory.mktemp("a100")
    started = time.perf_counter()
    r = run_cli(out, "analyze", shared_traces / "hta" / "a100_rank3_of8_train.json.gz", "--out", out)
    seconds = time.perf_counter() - started
    assert r.returncode == 0, r.stderr
    return out, seconds


def test_a100_report_is_small_fast_and_bounded(a100_report):
    out, seconds = a100_report
    html = (out / "report.html").read_text()
    assert len(html.encode()) < 2_000_000
    assert sections(html) == list(GPU_SECTIONS)
    assert_self_contained(html)
    panes = re.findall(r'<div class="tl\d+">(.*?)</div>', _timeline(html), re.DOTALL)
    assert len(panes) == 6  # the six steps, one pre-rendered view each
    for pane in panes:  # ~1,400 kernels and ~7,000 CPU operators per step
        assert pane.count("<rect") < 1_000
    started = time.perf_counter()
    render_report(load_summary(out), base_dir=out)
    assert time.perf_counter() - started < 10


def test_a100_report_timeline_shows_streams_and_idle_causes(a100_report):
    out, _ = a100_report
    tl = _timeline((out / "report.html").read_text())
    for lane in ("main thread", "DataLoader", "GPU 3 · stream 7", "GPU 3 · stream 21", "counted as"):
        assert f">{lane}</text>" in tl
    assert "launch wait" in tl and "communication kernel" in tl
    assert orjson.loads((out / "summary.json").read_bytes())["overall"]["verdict"] in tl


def test_control_characters_never_reach_the_page():
    from perfscope.reports.html import esc

    assert esc("gemm\x00<k>\x1f\ttab") == "gemm\ufffd&lt;k&gt;\ufffd\ttab"


def test_timeline_offers_every_rank_at_its_representative_step(tmp_path):
    (tmp_path / "r").mkdir()
    for r in range(3):
        gpu_trace(tmp_path / "r" / f"rank{r}.json", steps=5, rank=r)
    a = perfscope.analyze(tmp_path / "r")
    html = render_report(a.summary(), base_dir=tmp_path, tables=a.tables)
    labels = re.findall(r'<label for="tl\d+">([^<]*)</label>', html)
    assert labels[0].startswith("step ") and "(representative)" in " ".join(labels[:5])
    assert [lab.split(" · ")[0] for lab in labels[5:]] == ["rank 1", "rank 2"]
    assert len(re.findall(r'<div class="tl\d+">', html)) == len(labels) and "show rank 1, 2 at their representative steps" in html


def test_a_report_rendered_from_another_directory_finds_traces_given_by_a_relative_path(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "elsewhere").mkdir()
    gpu_trace(tmp_path / "work" / "t.json", steps=3)
    assert run_cli(tmp_path / "work", "analyze", "t.json", "--out", tmp_path / "out").returncode == 0
    r = run_cli(tmp_path / "elsewhere", "report", tmp_path / "out", "--out", tmp_path / "again.html")
    assert r.returncode == 0, r.stderr
    html = (tmp_path / "again.html").read_text()
    assert 'name="tl"' in html and "needs the trace files" not in html
