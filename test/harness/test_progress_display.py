"""The progress display: plain lines off a terminal, one redrawn line on it."""
import io

from harness.progress import Progress, clock_text


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_plain_lines_when_not_a_terminal():
    out, clock = io.StringIO(), Clock()
    p = Progress(out, live=False, clock=clock)
    p.start(2)
    p.start_cell(1, "tf2.21-cu12.5-py3.11")
    clock.now = 65
    p.step("build")
    clock.now = 130
    p.finish_cell("passed", "46 passed, 0 skipped")
    p.close()
    assert out.getvalue().splitlines() == [
        "[1/2] tf2.21-cu12.5-py3.11 · setup · 0:00 (total 0:00)",
        "[1/2] tf2.21-cu12.5-py3.11 · build · 1:05 (total 1:05)",
        "[1/2] tf2.21-cu12.5-py3.11: passed (46 passed, 0 skipped) in 2:10",
    ]


def test_live_line_is_redrawn_in_place():
    out, clock = io.StringIO(), Clock()
    p = Progress(out, live=True, clock=clock)  # no start(): no redraw thread in this test
    p.total = 1
    p.start_cell(1, "c")
    p.step("test")
    p.finish_cell("regressed")
    text = out.getvalue()
    assert text.count("\r\033[K") == 3 and text.endswith("[1/1] c: regressed in 0:00\n")
    assert "\n" not in text[:-1]


def test_clock_text():
    assert [clock_text(s) for s in (0, 59, 61, 3600 + 62)] == ["0:00", "0:59", "1:01", "1:01:02"]
