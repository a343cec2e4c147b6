"""The HTML report opened in real headless Chromium: it renders, and names users supply are escaped.

It shows the verdict table, the ratio chart with the margin band, the trials in run order and the start-up chart.
Also per-step lines and telemetry charts, screenshot checked.
The experiment is written through the real store API, with telemetry rows (no GPU here)."""

import math
import re

from gpuvs import events
from gpuvs.analysis import comparison
from gpuvs.store.records import ExperimentMeta, SampleRecord
from gpuvs.store.summary import summarize_samples
from gpuvs.report import html
from gpuvs.trial.runner import Arm, Experiment
from gpuvs.spec import RunSpec
from gpuvs.store.db import Store
from report_browser import chromium_dom, chromium_screenshot, distinct_colours, pixels_of

EVIL = "<script>alert(1)</script>"


def synthetic_experiment(path):
    """Two arms x 3 trials: 20 samples and 30 NVML readings per trial, arm B 10% faster, and a
    driver that differs between the arms although nobody varied it."""
    exp = Experiment(f"{EVIL} study", RunSpec(workload="cnn-train", device="cuda"),
                     [Arm("base"), Arm(EVIL, {"precision": "bf16"})], trials=3, seed=2, kind="compare",
                     meta=ExperimentMeta(margin=0.02, confidence=0.95))
    with Store(path) as st:
        st.create_experiment(exp.id, exp.name, exp.kind, exp.stored_meta())
        for k, spec in enumerate(exp.order()):
            tid = st.begin_trial(spec)
            rate = (1100.0 if spec.arm == EVIL else 1000.0) * (1 + 0.002 * math.sin(k))
            samples = []
            for step in range(1, 21):
                value = rate * (1 + 0.01 * math.sin(step + k))
                samples.append(events.sample(step, value, "images/sec", seconds=64 / value, items=64))
                st.add_event(tid, samples[-1])
            for i in range(30):
                st.add_event(tid, {"type": "telemetry", "t": i * 0.1, "gpu": 0, "util_gpu": 60 + i, "util_mem": 40,
                                   "mem_used_mib": 20000 + 10 * i, "power_w": 300.0 + 5 * i,
                                   "sm_clock_mhz": 1980, "temp_c": 50 + i / 3, "throttle": []})
            fp = {"gpu_name": "NVIDIA H100 80GB HBM3", "gpu_count": 1, "torch": "2.11.0",
                  "driver": "580.65" if spec.arm == "base" else "575.51", "cpu_model": "Xeon"}
            st.finish_trial(tid, "ok", fingerprint=fp,
                            summary=summarize_samples([SampleRecord.from_event(e) for e in samples]),
                            startup={"first_step_s": 1.5, "import_s": 2.0})
        return comparison.from_store(st, exp.id)


def test_html_report_renders_in_chromium_with_charts_verdicts_and_escaped_names(tmp_path):
    analysis = synthetic_experiment(tmp_path / "gpuvs.db")
    (v,) = analysis.headline_verdicts()
    assert v.verdict == "faster" and 1.09 < v.ratio < 1.11
    page = html.render(analysis)
    assert "<script" not in page and "http://" not in page and "https://" not in page  # self-contained, no script
    path = tmp_path / "report.html"
    path.write_text(page)

    dom = chromium_dom(path, tmp_path)
    assert "<script" not in dom and "&lt;script&gt;alert(1)&lt;/script&gt;" in dom
    assert '<table id="verdicts">' in dom and "v-faster" in dom and f"{v.ratio:.3f}×" in dom
    # the picture of the verdict: the arm's ratio with its interval, a line at 1, the ±2% band; no bars from zero
    assert dom.count('class="chart ratios"') == 1 and dom.count('class="chart bars"') == 0
    assert dom.count('class="chart trials"') == 1 and dom.count('class="chart startup"') == 1
    assert dom.count('class="chart steps"') == 1
    assert dom.count('class="chart telemetry"') == 5  # utilisation, memory, power, SM clock, temperature
    # 6 trials per step; a line of trials per arm in run order; 6 trials x 5 telemetry charts
    assert dom.count("<polyline") == 6 + 2 + 5 * 6
    assert "driver (580.65 vs 575.51)" in dom and '<tr class="differs">' in dom
    ratios = dom.split('class="chart ratios"')[1].split("</svg>")[0]
    band = re.search(r'class="margin-band" x="([\d.]+)" y="[\d.]+" width="([\d.]+)"', ratios)
    one = float(re.search(r'class="one" x1="([\d.]+)"', ratios).group(1))
    point = float(re.search(r'<circle cx="([\d.]+)"', ratios).group(1))
    low, width = float(band.group(1)), float(band.group(2))
    assert low < one < low + width < point  # 1.1x: right of the band, which holds the line at 1
    assert f"{v.ratio:.3f}× [" in ratios and "faster" in ratios  # the figures beside the axis, in words

    png = chromium_screenshot(path, tmp_path, size="1280,3600")
    assert distinct_colours(png) > 50
    assert pixels_of(png, (221, 237, 221), tolerance=4) > 3000  # the shaded margin band
    assert pixels_of(png, (0x4e, 0x79, 0xa7)) > 300 and pixels_of(png, (0xf2, 0x8e, 0x2b)) > 300  # both arms drawn


def test_the_start_up_chart_and_table_draw_the_milestones_in_the_order_they_happen(tmp_path):
    """A real stored comparison (the golden store's two-arm NLP run): each milestone's bars, and the start-up
    table's columns, come earliest first by mean seconds over the arms (launch_to_worker before import before
    launch_to_exit), never alphabetically."""
    import shutil

    import golden

    shutil.copy(golden.STORE, tmp_path / "golden.db")
    with Store(tmp_path / "golden.db") as st:
        a = comparison.from_store(st, golden.experiments(tmp_path / "golden.db")["golden-compare-nlp"])
    page = html.render(a)
    chart = page[page.index("Start-up: mean seconds from launch"):]
    shown = re.findall(r'text-anchor="end">([a-z_]+) · [^<]+</text>', chart[:chart.index("</svg>")])
    order = list(dict.fromkeys(shown))
    seen = {k: [arm.startup[key] for arm in a.arms for key in (k, k + "_s") if key in arm.startup] for k in order}
    mean = {k: sum(v) / len(v) for k, v in seen.items()}
    assert set(order) >= {"launch_to_worker", "import", "launch_to_exit"} and order != sorted(order)
    assert [mean[k] for k in order] == sorted(mean.values()), order
    head = re.search(r'<table id="startup">.*?<thead><tr>(.*?)</tr>', page, re.S).group(1)
    assert re.findall(r"<th>([a-z_]+)</th>", head)[1:] == order
