"""tf_cnn_benchmarks' log, and gpuvs's own step log, which follows its format.

total_images_per_sec is the headline; images_per_sec is cumulative (get_perf_timing), never averaged over lines.
total_loss is per step, and optional. Columns are found by the header; the block above the table goes to info."""

from __future__ import annotations

import re

from gpuvs.workloads.command.outputs import register
from gpuvs.workloads.command.outputs.parsing import Line, Metric, Parser, Reading, number

NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?nan|[-+]?inf"
HEADER = re.compile(r"^\s*Step\s+(?:Img/sec|images/sec)((?:\s+\S+)*)\s*$")
STEP = re.compile(rf"(?<![\w.])(\d+)\s+images/sec:\s+({NUM})\s+\+/-\s+({NUM})\s+\(jitter\s*=\s*({NUM})\)(.*)$")
TOTAL = re.compile(rf"total images/sec:\s+({NUM})\s*$")
SETTING = re.compile(r"^(TensorFlow|Model|Dataset|Mode|Batch size|Num batches|Num epochs|Devices|Num devices|"
                     r"Data format|Precision|Optimizer|Variables|Image size|Timed steps|Warm-up steps):\s*(.*?)\s*$")


@register
class TfCnnBenchmarks(Parser):
    name = "tf_cnn_benchmarks"
    summary = "tf_cnn_benchmarks' log and gpuvs's step log: total images/sec, the running rate, total_loss per step"

    def __init__(self, arg=None, job=None):
        super().__init__(arg, job)
        self.metrics = (
            Metric("total_images_per_sec", "higher", "images/sec", read_from="the closing 'total images/sec: N' line",
                   description="total images over the timed loop's time", kind="rate"),
            Metric("images_per_sec", "higher", "images/sec", per_step=True, cumulative=True, required=False,
                   read_from="the step lines' 'images/sec: X +/- Y (jitter = Z)'",
                   description="batch size / mean step time over every step so far, with +/- and jitter",
                   kind="rate"),
            Metric("total_loss", "lower", "", per_step=True, required=False,
                   read_from="the step lines' total_loss column", description="the loss of that step"),
        )
        self.headline = "total_images_per_sec"
        self._columns: list[str] = ["total_loss"]
        self._in_table = False

    def feed(self, line: Line) -> list[Reading]:
        text = line.text
        if (m := HEADER.match(text)) is not None:
            self._columns = m.group(1).split()
            self._in_table = True
            return []
        if (m := STEP.search(text)) is not None:
            self._in_table = True
            step = int(m.group(1))
            what = f"tf_cnn_benchmarks step line ({line.source})"
            out = [self.reading("images_per_sec", number(m.group(2), what), line, step,
                                pm=number(m.group(3), what), jitter=number(m.group(4), what))]
            cells = dict(zip(self._columns, m.group(5).split()))
            loss = cells.get("total_loss", cells.get("loss"))
            if loss is not None:
                out.append(self.reading("total_loss", number(loss, what), line, step))
            return out
        if (m := TOTAL.search(text)) is not None:
            return [self.reading("total_images_per_sec", number(m.group(1), f"total images/sec ({line.source})"), line)]
        if not self._in_table and (m := SETTING.match(text)) is not None:
            self.info[m.group(1).lower().replace(" ", "_").replace("-", "_")] = m.group(2)
        return []
