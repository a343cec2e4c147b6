"""GPU proof of issues 25 and 36, a verdict in the time it takes to measure: old and new side by side, about 8 minutes.

    OUT=DIR [DEVICE=cuda|cpu] [TOTAL_S=530] [PARTS=e,b,a,d,c] PYTHONPATH=src python benchmarks/time_to_verdict.py
Every figure is read from gpuvs's own store; the parts and the other settings are listed below the imports.
Writes $OUT/time_to_verdict.md, rewritten after every part so a stop returns what was done, and its .db and .log."""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "src"))

from gpuvs.analysis import comparison  # noqa: E402
from gpuvs.report import tables  # noqa: E402
from gpuvs.store.db import Store  # noqa: E402

# The parts (PARTS, in that order). b, w and h named twice run twice; a named again runs the new mechanism alone;
# k named again runs the rest of its jobs. Issue 36 in one call under 8 minutes: TOTAL_S=450 PARTS=s,b,w,l.
#   e  the plain PyTorch loop (benchmarks/plain_loop.py), twice, against gpuvs's figure of the job of b and c;
#      run first, it also warms the machine's caches
#   b  an A/A --until-confident within ±1% on ResNet-50 bf16 NHWC batch 256: wall time to the verdict (target 45 s).
#      The first gpuvs command on a fresh machine fills the bytecode cache (gpuvs.trial.bytecode); later ones read it
#   a  `gpuvs compare cnn-train` at its defaults, new (fork, events read once completed, bytecode cached) and old
#      (--fresh exec, GPUVS_TIMED_READ=blocking, GPUVS_PYCACHE=off): the share of wall time in timed steps
#      (target at least half); A_OLD=0 leaves the old run out
#   d  the dip: per-step rates of steps 1, 11, 21 against the others at --display-every 10, old reading and new
#   c  fresh exec against fork in one interleaved comparison, ROUNDS rounds: each one's trial-to-trial spread
#      (Brown-Forsythe's test on log figures, an F-test on variances) and fork against exec within ±1%
#   s  step series: 3 trials of one warm-up step and SERIES_STEPS timed steps, every step's seconds written to
#      $OUT/warmup_series.json (tests/data/warmup/'s format, which tests/workloads/test_warmup.py replays)
#   w  the A/A of b with the adaptive warm-up (the default): wall time, shares, and what each warm-up decided
#   l  the adaptive warm-up against a fixed --warmup-steps 50, interleaved, 4 trials each (target within ±0.5%)
#   h  the A/A of w with --cudnn heuristics (nothing is timed in the first step)
#   k  --cudnn benchmark against heuristics, 3 trials an arm, on the K_JOBS jobs; K_FIRST=N runs the first N jobs,
#      and k named again the rest
# STEPS=N: the A/A's timed steps (default 30). NUM_GPUS=N: the A/A on N GPUs (DDP). W_LIMIT: w's and h's limit.
# Each part has a time limit: gpuvs is stopped with SIGTERM at it and keeps what it finished; c gets what is left.
# A part whose limit no longer fits in what is left of TOTAL_S is skipped, and said so. DEVICE=cpu: toy sizes,
# a check of the script, not a measurement.
OUT = Path(os.environ.get("OUT") or "out")
OUT.mkdir(parents=True, exist_ok=True)
DB, MD, LOG = OUT / "time_to_verdict.db", OUT / "time_to_verdict.md", OUT / "time_to_verdict.log"
DEVICE = os.environ.get("DEVICE", "cuda")
GPU = DEVICE == "cuda"
TOTAL_S = float(os.environ.get("TOTAL_S") or (530 if GPU else 420))
ROUNDS = int(os.environ.get("ROUNDS") or (8 if GPU else 2))
T0 = time.monotonic()
PY = sys.executable

if GPU:
    JOB_BASE = ["--model", "resnet50", "--batch-size", "256", "--precision", "bf16", "--data-format", "NHWC",
                "--steps", os.environ.get("STEPS") or "30"]
    if int(os.environ.get("NUM_GPUS") or 1) > 1:  # the A/A across several GPUs (their warm-up: a fixed 10 steps)
        JOB_BASE[-2:-2] = ["--num-gpus", os.environ["NUM_GPUS"]]  # before --steps N (JOB_BASE[:-2] drops that)
    JOB = JOB_BASE + ["--warmup-steps", "10"]  # the warm-up before issue 36: a fixed 10 steps
    ADAPTIVE: list[str] = []  # no --warmup-steps: the adaptive warm-up, as a user gets it
    SERIES_STEPS = int(os.environ.get("SERIES_STEPS") or 100)
    PLAIN = ["resnet50", "256", "bf16", "NHWC", "30", "10"]
    DEFAULTS: list[str] = []  # cnn-train exactly at its defaults (ResNet-50, batch 64, fp32, 100 steps)
    DISPLAY = 10
    UNTIL = []  # --max-trials at its default (20)
    LIMITS = {"e": 45, "b": 110, "a_new": 110, "a_old": 175, "d": 50,  # old trials take about 24 s each
              "s": 90, "l": 120, "k": 100}
    LIMITS["w"] = LIMITS["h"] = int(os.environ.get("W_LIMIT") or 110)
    # k: jobs whose rate is compared with cuDNN's algorithms timed (benchmark) and chosen by its heuristics
    K_JOBS = [["--model", "resnet50", "--batch-size", "256", "--precision", "bf16", "--data-format", "NHWC"],
              [],  # cnn-train's defaults: ResNet-50, batch 64, fp32, NCHW
              ["--model", "resnet50", "--batch-size", "256", "--precision", "fp32", "--data-format", "NCHW"],
              ["--model", "resnet50", "--batch-size", "256", "--precision", "fp16", "--data-format", "NHWC"],
              ["--model", "resnet18", "--batch-size", "256", "--precision", "bf16", "--data-format", "NHWC"],
              ["--model", "vgg16", "--batch-size", "64", "--precision", "bf16", "--data-format", "NHWC"]]
    K_STEPS = ["--steps", "50"]
else:
    JOB_BASE = ["--model", "resnet18", "--batch-size", "2", "--image-size", "32", "--steps", "6"]
    JOB = JOB_BASE + ["--warmup-steps", "2"]
    ADAPTIVE = ["--warmup-steps", "0"]  # the CPU's own default is a fixed 2: ask for the adaptive one
    SERIES_STEPS = int(os.environ.get("SERIES_STEPS") or 20)
    PLAIN = ["resnet18", "2", "fp32", "NCHW", "6", "2", "cpu", "size=32"]
    DEFAULTS = ["--model", "resnet18", "--batch-size", "2", "--image-size", "32", "--warmup-steps", "2",
                "--steps", "8"]
    DISPLAY = 2
    UNTIL = ["--max-trials", "4"]
    LIMITS = {"e": 60, "b": 90, "a_new": 60, "a_old": 60, "d": 60, "s": 90, "w": 120, "l": 120, "h": 120, "k": 90}
    K_JOBS = [JOB_BASE[:-2]]
    K_STEPS = ["--steps", "4", "--warmup-steps", "1"]

results: dict[str, dict] = {}
notes: list[str] = []


def elapsed() -> float:
    return time.monotonic() - T0


def say(text: str) -> None:
    print(f"[{elapsed():6.1f} s] {text}", flush=True)


def log(text: str) -> None:
    with LOG.open("a") as fh:
        fh.write(text.rstrip() + "\n")


def gpuvs(name: str, args: list[str], limit: float, env: dict[str, str] | None = None) -> dict:
    """Run `gpuvs ARGS --name NAME` with a time limit (SIGTERM at it: gpuvs keeps what it finished)."""
    cmd = [PY, "-m", "gpuvs", *args, "--device", DEVICE, "--store", str(DB), "--name", name, "--quiet"]
    full_env = dict(os.environ, PYTHONPATH=str(HERE / "src"), PYTHONUNBUFFERED="1", COLUMNS="160", **(env or {}))
    say(f"{name}: gpuvs {' '.join(args)} (limit {limit:.0f} s)")
    t = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env, cwd=HERE)
    stopped = False
    try:
        out, err = proc.communicate(timeout=max(1.0, limit))
    except subprocess.TimeoutExpired:
        stopped = True
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    wall = time.monotonic() - t
    log(f"=== {name} ({wall:.1f} s, exit {proc.returncode}{', stopped at its limit' if stopped else ''})\n"
        f"$ {' '.join(cmd)}\n{out[-6000:]}\n{err[-3000:]}")
    say(f"{name}: exit {proc.returncode} after {wall:.1f} s{' (stopped at its limit)' if stopped else ''}")
    return {"wall": wall, "code": proc.returncode, "stopped": stopped, "cmd": "gpuvs " + " ".join(args)}


def plain() -> float | None:
    args = [PY, str(HERE / "benchmarks" / "plain_loop.py"), *PLAIN]
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    log(f"=== plain loop: {' '.join(args)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    if p.returncode:
        return None
    return float(json.loads(p.stdout.strip().splitlines()[-1])["images_per_sec"])


def analysis(name: str):
    """The stored experiment of that name, analysed as every report is (None if it stored nothing)."""
    if not DB.exists():
        return None
    with Store(DB) as st:
        found = [e for e in st.experiments() if e.name == name]
        if not found:
            return None
        a = comparison.from_store(st, found[-1].id, with_steps=False)
        a.samples = {t.id: st.samples(t.id) for t in st.trials(found[-1].id)}
        a.records = st.trials(found[-1].id)
    return a


def headline(a) -> dict | None:
    vs = a.headline_verdicts() if a else []
    return vs[-1] if vs else None


def trial_values(a, arm: str | None = None) -> list[float]:
    return [t.value for t in a.trials if t.status == "ok" and t.value and (arm is None or t.arm == arm)]


def per_arm_time(a, arm: str) -> dict[str, float]:
    """Mean seconds per trial of one arm's parts (timeshare's definitions), and its share in timed steps."""
    from gpuvs.analysis import timeshare

    parts = [timeshare.trial_time(r.startup or {}, r.summary or {}, r.config) for r in a.records if r.arm == arm]
    parts = [p for p in parts if p is not None]
    if not parts:
        return {}
    mean = lambda f: statistics.fmean(getattr(p, f) for p in parts)
    out = {k: mean(k + "_s") for k in ("measured", "fork", "warm_up", "start_up", "teardown", "wall")}
    out["n"] = len(parts)
    out["share"] = out["measured"] / out["wall"]
    return out


def md_time(ts) -> list[str]:
    t = tables.time_shares_table(ts)
    if t is None:
        return ["(no timing stored)"]
    rows = ["| " + " | ".join(t.columns) + " |", "|" + "---|" * len(t.columns)]
    rows += ["| " + " | ".join(r) + " |" for r in t.rows]
    return rows + ["", t.note]


def facts(a) -> list[str]:
    """What the experiment's zygotes said when ready, and its failed trials: the lines to read first when a
    figure looks wrong."""
    out = []
    for z in (a.meta.timing or {}).get("zygotes") or [] if a else []:
        out.append(f"- zygote: imports {z.get('import_s') or 0:.1f} s, bytecode kept {z.get('bytecode') or '-'}, "
                   f"threads after them {z.get('threads')}, CUDA {z.get('cuda')}"
                   + (f", PROBLEM: {z['problem']}" if z.get("problem") else ""))
    for f in (a.failures if a else [])[:4]:
        out.append(f"- FAILED trial {f.trial + 1} [{f.arm}] {f.status}: {f.error[:300]}")
    return out + [""] if out else out


def verdict_text(v) -> str:
    if not v:
        return "no verdict (too few trials)"
    ci = f" [{v.ci_low:.4f}, {v.ci_high:.4f}]" if v.ci_low is not None else ""
    ratio = f"{v.ratio:.4f}" if v.ratio is not None else "-"
    return f"{tables.verdict_word(v)} ({v.arm} / {v.baseline} = {ratio}{ci}, {v.method or '-'})"


# -- the parts --------------------------------------------------------------------------------------

def part_e() -> None:
    runs = []
    deadline = time.monotonic() + LIMITS["e"]
    for _ in range(2):
        if time.monotonic() > deadline:
            break
        say("e: plain PyTorch loop " + " ".join(PLAIN))
        runs.append(plain())
        say(f"e: plain loop {runs[-1]} images/sec")
    results["e"] = {"plain": [r for r in runs if r]}


def part_b() -> None:
    """The A/A; run again (PARTS=...,b,...,b) to see it with gpuvs's bytecode cache empty and then filled."""
    runs = results.setdefault("b", [])
    name = "b: A/A until-confident" + (f" #{len(runs) + 1}" if runs else "")
    cached = bytecode_cached()
    run = gpuvs(name, ["compare", "cnn-train", *JOB, "--margin", "0.01", "--arm", "a:seed=1", "--arm", "b:seed=2",
                       "--until-confident", *UNTIL, "--order-seed", "7"], LIMITS["b"])
    runs.append({"run": run, "name": name, "cache_before": cached})


def bytecode_cached() -> str:
    """Whether gpuvs's bytecode cache (gpuvs.trial.bytecode) holds anything before a run, in words."""
    from gpuvs.trial import bytecode

    where = Path(bytecode.folder())
    n = sum(1 for _ in where.rglob("*.pyc")) if where.is_dir() else 0
    return f"{n} modules' bytecode in {where} before the run" if n else f"{where} empty before the run"


def part_a() -> None:
    """New, then old; named again in PARTS, the new mechanism alone once more (its spread from run to run)."""
    runs = results.setdefault("a", [])
    done = sum(1 for k, _ in runs if k != "old")
    key = "new" if not done else f"new #{done + 1}"
    runs.append((key, gpuvs(f"a: defaults, {key}", ["compare", "cnn-train", *DEFAULTS, "--arm", "a:seed=1", "--arm",
                                                   "b:seed=2", "--order-seed", "7"], LIMITS["a_new"])))
    if done or os.environ.get("A_OLD") == "0":  # A_OLD=0: the new mechanism alone
        return
    write()
    runs.append(("old", gpuvs("a: defaults, old", ["compare", "cnn-train", *DEFAULTS, "--arm", "a:seed=1", "--arm",
                                                  "b:seed=2", "--order-seed", "7", "--fresh", "exec"], LIMITS["a_old"],
                              env={"GPUVS_TIMED_READ": "blocking", "GPUVS_PYCACHE": "off"})))


def part_d() -> None:
    d = ["--display-every", str(DISPLAY)]
    run = gpuvs("d: the dip", ["compare", "cnn-train", *JOB, *d, "--arm", "before:env_var=GPUVS_TIMED_READ=blocking",
                               "--arm", "after:seed=0", "--trials", "2", "--order-seed", "3"], LIMITS["d"])
    results["d"] = {"run": run}


def part_c() -> None:
    left = TOTAL_S - elapsed() - 15  # the markdown and the answer's transfer
    run = gpuvs("c: exec vs fork", ["compare", "cnn-train", *JOB, "--margin", "0.01", "--arm", "exec:fresh=exec",
                                    "--arm", "fork:fresh=fork", "--trials", str(ROUNDS), "--order-seed", "11"],
                max(30.0, left))
    results["c"] = {"run": run}


def part_s() -> None:
    run = gpuvs("s: step series", ["run", "cnn-train", *JOB_BASE[:-2], "--steps", str(SERIES_STEPS), "--warmup-steps",
                                   "1", "--trials", "3"], LIMITS["s"])
    results["s"] = {"run": run}
    a = analysis("s: step series")
    series = []
    for r in (a.records if a else []):
        seconds = [x.seconds for x in sorted(a.samples.get(r.id) or [], key=lambda x: x.step) if x.series == "main"]
        first = (r.startup or {}).get("first_step_s")
        if r.status == "ok" and first and seconds:
            series.append({"name": f"trial {r.trial + 1}", "times_s": [round(float(first), 7)]
                           + [round(float(x), 7) for x in seconds]})
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip().splitlines()[:1] if GPU else []
    (OUT / "warmup_series.json").write_text(json.dumps(
        {"device": DEVICE, "gpu": gpu[0] if gpu else None, "source": "benchmarks/time_to_verdict.py part s: "
         + run["cmd"] + " (the first step's seconds, then every timed step's; one warm-up step: the first)",
         "job": "cnn-train " + " ".join(JOB_BASE[:-2]), "series": series}, indent=1) + "\n")
    results["s"]["trials"] = len(series)


def adaptive_aa(key: str, name: str, extra: list[str]) -> None:
    """The A/A with the adaptive warm-up, until confident within ±1% (parts w and h); named again, once more."""
    runs = results.setdefault(key, [])
    name += f" #{len(runs) + 1}" if runs else ""
    run = gpuvs(name, ["compare", "cnn-train", *JOB_BASE, *ADAPTIVE, *extra, "--margin", "0.01", "--arm", "a:seed=1",
                       "--arm", "b:seed=2", "--until-confident", *UNTIL, "--order-seed", "7"], LIMITS[key])
    runs.append({"run": run, "name": name})


def part_w() -> None:
    adaptive_aa("w", "w: A/A until-confident, adaptive warm-up", [])


def part_h() -> None:
    """The A/A of w with cuDNN's heuristics choosing the algorithms (--cudnn heuristics): nothing timed in the
    first step."""
    adaptive_aa("h", "h: A/A until-confident, adaptive warm-up, cudnn heuristics", ["--cudnn", "heuristics"])


def part_k() -> None:
    """Each job of K_JOBS with cuDNN's algorithms timed against chosen by its heuristics: 3 trials an arm,
    interleaved; stops when what is left of TOTAL_S cannot hold the next job."""
    runs = results.setdefault("k", [])
    first = not runs
    start = len(runs)
    stop = start + int(os.environ.get("K_FIRST") or len(K_JOBS)) if first else len(K_JOBS)
    for n, job in list(enumerate(K_JOBS, 1))[start:stop]:
        if elapsed() + LIMITS["k"] + 10 > TOTAL_S:
            notes.append(f"- k: jobs {n}..{len(K_JOBS)} not run: {TOTAL_S - elapsed():.0f} s left of TOTAL_S")
            break
        name = f"k{n}: cudnn benchmark vs heuristics"
        run = gpuvs(name, ["compare", "cnn-train", *job, *K_STEPS, "--margin", "0.01", "--arm",
                           "benchmark:cudnn=benchmark", "--arm", "heuristics:cudnn=heuristics", "--trials", "3",
                           "--order-seed", "3"], LIMITS["k"])
        runs.append({"run": run, "name": name, "job": " ".join(job) or "(defaults)"})
        write()


def part_l() -> None:
    adaptive = "adaptive:warmup_steps=0"
    run = gpuvs("l: adaptive vs long warm-up", ["compare", "cnn-train", *JOB_BASE, "--margin", "0.005", "--arm",
                                                "long:warmup_steps=50", "--arm", adaptive, "--trials", "4",
                                                "--order-seed", "5"], LIMITS["l"])
    results["l"] = {"run": run}


def warm_ups(a) -> list[str]:
    """Each trial's warm-up as it decided: steps, seconds, why it stopped."""
    out = []
    for r in (a.records if a else []):
        stop = (r.config or {}).get("warmup_stop")
        steps = (r.config or {}).get("warmup_steps")
        out.append(f"trial {r.trial + 1} [{r.arm}]: {steps} steps, {(r.startup or {}).get('warmup_s') or 0:.2f} s "
                   f"(first step {(r.startup or {}).get('first_step_s') or 0:.2f} s), {stop or 'fixed'}")
    return out


def write_36(L: list[str]) -> None:
    if "s" in results:
        L += ["## s. Step series recorded", "", f"`{results['s']['run']['cmd']}`: {results['s'].get('trials', 0)} "
              f"series written to warmup_series.json (copy it to tests/data/warmup/ as <gpu>-resnet50-bf16.json)", ""]
    rows = []
    for key, label in (("b", f"before: --warmup-steps {JOB[-1]} (fixed)"), ("w", "after: adaptive (" + (
            " ".join(ADAPTIVE) or "no --warmup-steps") + ")"), ("h", "adaptive, --cudnn heuristics")):
        for n, b in enumerate(results.get(key) or [], 1):
            a = analysis(b["name"])
            if not a:
                continue
            v = headline(a)
            per = max((sum(1 for t in a.trials if t.arm == arm) for arm in ("a", "b")), default=0)
            t = a.time
            rows.append(f"| {label} #{n} | {b['run']['wall']:.1f}{' (stopped)' if b['run']['stopped'] else ''} | "
                        f"{verdict_text(v)} | {per} | "
                        + (f"{100 * t.shares['measured']:.1f}% | {100 * t.shares['warm_up']:.1f}% | "
                           f"{t.per_trial.get('warm_up', 0):.2f} | {t.per_trial.get('wall', 0):.2f} |" if t else
                           "- | - | - | - |"))
            if key in ("w", "h"):
                L_w.extend([f"- {label} #{n}: " + "; ".join(warm_ups(a))] + facts(a))
    if rows:
        L += ["## Issue 36: the A/A within ±1%, fixed warm-up against adaptive", "",
              f"Job: cnn-train {' '.join(JOB_BASE)}, `--until-confident --margin 0.01` (targets: at most 45 s, at "
              "least 60% of the wall time in timed steps)", "",
              "| warm-up | wall s (command) | verdict | trials per arm | timed steps | warm-up | warm-up s a trial | "
              "wall s a trial |", "|---|---|---|---|---|---|---|---|"] + rows + [""] + L_w + [""]
        L_w.clear()
    if results.get("k"):
        L += ["## k. cuDNN's algorithms timed (benchmark, the default) against its heuristics", "",
              f"`gpuvs compare cnn-train JOB {' '.join(K_STEPS)} --arm benchmark:cudnn=benchmark --arm "
              "heuristics:cudnn=heuristics --trials 3 --margin 0.01`", "",
              "| job | benchmark: rate, first step s | heuristics: rate, first step s | heuristics / benchmark |",
              "|---|---|---|---|"]
        for k in results["k"]:
            a = analysis(k["name"])
            cells = []
            for arm in ("benchmark", "heuristics"):
                vals = trial_values(a, arm) if a else []
                firsts = [(r.startup or {}).get("first_step_s") for r in (a.records if a else []) if r.arm == arm]
                firsts = [f for f in firsts if f is not None]
                cells.append((f"{statistics.fmean(vals):.1f} (CV {100 * cv(vals):.2f}%)" if vals else "-")
                             + (f", {min(firsts):.2f}–{max(firsts):.2f}" if firsts else ""))
            L.append(f"| {k['job']}{' (stopped)' if k['run']['stopped'] else ''} | {cells[0]} | {cells[1]} | "
                     f"{verdict_text(headline(a)) if a else '-'} |")
        L.append("")
    if "l" in results:
        a = analysis("l: adaptive vs long warm-up")
        L += ["## l. Adaptive warm-up against a long fixed one (50 steps)", "", f"`{results['l']['run']['cmd']}`"
              + (" (stopped at its limit)" if results["l"]["run"]["stopped"] else ""), ""]
        if a:
            for arm in ("long", "adaptive"):
                vals = trial_values(a, arm)
                if vals:
                    L.append(f"- {arm}: mean {statistics.fmean(vals):.1f} images/sec, CV {100 * cv(vals):.2f}%, "
                             + ", ".join(f"{x:.1f}" for x in vals))
            L += [f"- adaptive against long: **{verdict_text(headline(a))}** (target: the ratio within ±0.5%)",
                  "- " + "; ".join(warm_ups(a))] + facts(a) + [""]


L_w: list[str] = []


# -- the markdown -----------------------------------------------------------------------------------

def dip(a, arm: str) -> tuple[float, float, int] | None:
    """Mean rate of the steps after a synchronise (1, D+1, 2D+1...) over the mean of the other steps, minus 1
    (per trial, then averaged), the worst such step's, and the trials used."""
    out, worst = [], []
    for r in a.records:
        if r.arm != arm or r.status != "ok":
            continue
        rates = {s.step: s.value for s in a.samples[r.id] if s.series == "main" and s.value}
        after = [rates[k] for k in rates if (k - 1) % DISPLAY == 0]
        rest = [rates[k] for k in rates if (k - 1) % DISPLAY != 0]
        if after and rest:
            base = statistics.fmean(rest)
            out.append(statistics.fmean(after) / base - 1)
            worst.append(min(after) / base - 1)
    return (statistics.fmean(out), min(worst), len(out)) if out else None


def brown_forsythe(x: list[float], y: list[float]) -> tuple[float, float, float, float]:
    """(Brown-Forsythe W, p, F = var ratio y/x, two-sided p of the F-test) on the log figures."""
    from scipy import stats as sps

    lx, ly = [math.log(v) for v in x], [math.log(v) for v in y]
    w, p = sps.levene(lx, ly, center="median")
    f = statistics.variance(ly) / statistics.variance(lx)
    pf = 2 * min(sps.f.cdf(f, len(ly) - 1, len(lx) - 1), sps.f.sf(f, len(ly) - 1, len(lx) - 1))
    return float(w), float(p), float(f), float(pf)


def cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else float("nan")


def write() -> None:
    L = ["# Time to a verdict (issues 25 and 36)", ""]
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip() if GPU else "none (DEVICE=cpu: a check of "\
                                                                                     "the script, not a measurement)"
    import torch

    L += [f"GPU: {gpu}; torch {torch.__version__}; {time.strftime('%Y-%m-%d %H:%M')}; this run took "
          f"{elapsed():.0f} s of its {TOTAL_S:.0f} s", ""]
    L += [f"Job of b, c, d, e: cnn-train {' '.join(JOB)}; `--margin 0.01` for b and c.", ""]

    write_36(L)
    for n, b in enumerate(results.get("b") or [], 1):
        a = analysis(b["name"])
        run = b["run"]
        v = headline(a)
        per = max((sum(1 for t in a.trials if t.arm == arm) for arm in ("a", "b")), default=0) if a else 0
        L += [f"## b. A/A until-confident within ±1%, new mechanism (run {n}: {b['cache_before']})", "",
              f"`{run['cmd']}`", "",
              f"- verdict: **{verdict_text(v)}** after {per} trials per arm",
              f"- wall time to the verdict: **{run['wall']:.1f} s** from the command's start to its exit "
              f"(target 45 s; 110 s before){' — stopped at its limit' if run['stopped'] else ''}"]
        L += facts(a)
        if a and a.time:
            L += [f"- the experiment's own wall time {a.time.wall_s:.1f} s; timed steps "
                  f"{100 * a.time.shares['measured']:.1f}% of it", ""] + md_time(a.time)
        L.append("")

    if "a" in results:
        L += ["## a. `gpuvs compare cnn-train` at its defaults: where the time went, old and new", ""]
        rows = []
        for key, run in results["a"]:
            label = ("old: --fresh exec, GPUVS_TIMED_READ=blocking, GPUVS_PYCACHE=off" if key == "old" else
                     key + ": fork, events read once completed")
            a = analysis(f"a: defaults, {key}")
            L += [f"### {label}", "", f"`{run['cmd']}`" + (" (stopped at its limit: the trials it finished)"
                                                          if run["stopped"] else ""), ""]
            L += facts(a)
            if a and a.time:
                L += md_time(a.time) + [""]
                t = a.time
                rows.append((label, t.shares["measured"], t.per_trial, t.trials, t.wall_s))
        if rows:
            L += ["### side by side", "", "| | trials | wall s | share in timed steps | per trial: wall | measured | "
                  "start-up | warm-up | fork | teardown |", "|---|---|---|---|---|---|---|---|---|---|"]
            for label, share, per, n, wall in rows:
                L.append(f"| {label} | {n} | {wall:.1f} | **{100 * share:.1f}%** | {per.get('wall', 0):.2f} | "
                         f"{per.get('measured', 0):.2f} | {per.get('start_up', 0):.2f} | {per.get('warm_up', 0):.2f} | "
                         f"{per.get('fork', 0):.2f} | {per.get('teardown', 0):.2f} |")
            L += ["", "Target: at least half of the wall time in timed steps with the new mechanism.", ""]

    if "d" in results:
        a = analysis("d: the dip")
        L += ["## d. The dip after a synchronise", "", f"`{results['d']['run']['cmd']}`", ""]
        if a:
            L += [f"Steps 1, {DISPLAY + 1}, {2 * DISPLAY + 1}... against the other steps of the same trial "
                  f"(--display-every {DISPLAY}):", "", "| reading | trials | mean of those steps vs the others | "
                  "worst such step | figure (mean of trials) |", "|---|---|---|---|---|"]
            for arm, label in (("before", "old: synchronise at display steps"), ("after", "new: events read once "
                                                                                          "completed")):
                got = dip(a, arm)
                vals = trial_values(a, arm)
                if got:
                    L.append(f"| {label} | {got[2]} | {100 * got[0]:+.2f}% | {100 * got[1]:+.2f}% | "
                             f"{statistics.fmean(vals):.1f} |")
            L += ["", f"Verdict, new reading against old: {verdict_text(headline(a))}", ""] + facts(a)

    if "c" in results:
        a = analysis("c: exec vs fork")
        L += ["## c. Independence: fresh exec against fork, interleaved", "", f"`{results['c']['run']['cmd']}`"
              + (" (stopped at its limit: the rounds it finished)" if results["c"]["run"]["stopped"] else ""), ""]
        if a:
            ex, fk = trial_values(a, "exec"), trial_values(a, "fork")
            L += [f"- trials: exec {len(ex)}, fork {len(fk)} (target at least 8 each)"]
            for arm, vals in (("exec", ex), ("fork", fk)):
                if vals:
                    L.append(f"- {arm}: mean {statistics.fmean(vals):.1f}, CV {100 * cv(vals):.2f}%, figures "
                             + ", ".join(f"{x:.1f}" for x in vals))
            if len(ex) > 2 and len(fk) > 2:
                w, p, f, pf = brown_forsythe(ex, fk)
                L.append(f"- spreads: Brown–Forsythe (Levene's test about the median) on the log figures W = {w:.3f}, "
                         f"p = {p:.3f}; F-test on the variances of the log figures: fork/exec = {f:.2f}, two-sided "
                         f"p = {pf:.3f} (p ≥ 0.05: no evidence that forking changes the trial-to-trial spread)")
            L.append(f"- verdict, fork against exec: **{verdict_text(headline(a))}**")
            L += facts(a)
            for arm in ("exec", "fork"):
                t = per_arm_time(a, arm)
                if t:
                    L.append(f"- per trial, {arm}: wall {t['wall']:.2f} s, timed steps {t['measured']:.2f} s "
                             f"({100 * t['share']:.1f}%), start-up {t['start_up']:.2f}, warm-up {t['warm_up']:.2f}, "
                             f"fork {t['fork']:.3f}, teardown {t['teardown']:.2f}")
            L.append("")

    if "e" in results:
        plains = results["e"]["plain"]
        L += ["## e. Nothing else slows: gpuvs against the plain PyTorch loop", "",
              f"`python benchmarks/plain_loop.py {' '.join(PLAIN)}`: "
              + (", ".join(f"{x:.1f}" for x in plains) + " images/sec" if plains else "no figure"), ""]
        if plains:
            ref = statistics.fmean(plains)
            names = {"b": "b: A/A until-confident", "c": "c: exec vs fork"}  # the first A/A
            for part, arm, label in (("b", None, "b (fork)"), ("c", "fork", "c, fork arm"), ("c", "exec", "c, exec arm")):
                a = analysis(names[part]) if part in results else None
                vals = trial_values(a, arm) if a else []
                if vals:
                    L.append(f"- {label}: {statistics.fmean(vals):.1f} images/sec over {len(vals)} trials: "
                             f"**{statistics.fmean(vals) / ref:.4f}** of the plain loop (target within 1%)")
            L.append("")
    L += notes
    MD.write_text("\n".join(L) + "\n")


def main() -> int:
    LOG.write_text("")
    say(f"time_to_verdict: DEVICE={DEVICE}, TOTAL_S={TOTAL_S:.0f}, ROUNDS={ROUNDS}, OUT={OUT}")
    chosen = [p.strip() for p in (os.environ.get("PARTS") or "e,b,a,d,c").split(",") if p.strip()]
    bad = [p for p in chosen if p not in "e b a d c s w l h k".split()]
    if bad:
        print(f"time_to_verdict: PARTS={','.join(bad)}: not among e, b, a, d, c, s, w, l, h, k", file=sys.stderr)
        return 2
    for part in [globals()[f"part_{p}"] for p in chosen]:
        key = part.__name__[len("part_"):]
        need = LIMITS.get(key, LIMITS.get("a_new", 0) if key == "a" else 0)
        if key in "swlbh" and elapsed() + need + 15 > TOTAL_S:  # what is left cannot hold it: say so, go on
            notes.append(f"- {part.__name__} skipped: its limit of {need:.0f} s does not fit in the "
                         f"{TOTAL_S - elapsed():.0f} s left of TOTAL_S")
            say(notes[-1])
            continue
        try:
            part()
        except Exception as exc:  # one part's failure does not lose the others
            notes.append(f"- {part.__name__} failed: {type(exc).__name__}: {exc}")
            say(notes[-1])
        try:
            write()
        except Exception as exc:
            say(f"writing the markdown failed: {type(exc).__name__}: {exc}")
        say(f"{part.__name__} done; {TOTAL_S - elapsed():.0f} s of the budget left")
    print(MD.read_text(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
