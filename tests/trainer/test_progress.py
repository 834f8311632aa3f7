"""Progress where no terminal shows a bar: plain lines, one at least every interval even when
nothing advances, a last one at the end; and the row totals predict/evaluate count to."""

from __future__ import annotations

import io
import time

from polling import until

from tierserve.trainer.progress import PlainProgress, heartbeat, progress_bar


def test_a_pipe_gets_plain_periodic_lines_not_carriage_returns():
    stream = io.StringIO()
    bar = progress_bar(total=10, unit="it", desc="fit", file=stream)
    assert isinstance(bar, PlainProgress)  # StringIO is no terminal
    bar.close()
    bar = PlainProgress(total=10, unit="it", desc="fit", file=stream, interval=0.05)
    bar.update(3)
    bar.set_postfix(loss="0.5")
    # no update for a while: the timer still writes (a slow step shows it is alive)
    assert until(lambda: stream.getvalue().count("\n") >= 3, timeout=10)
    bar.update(7)
    bar.close()
    text = stream.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert all(line.startswith("fit: ") for line in lines)
    assert "fit: 3/10 it" in lines[2] and "loss=0.5" in lines[2]
    assert lines[-1].startswith("fit: 10/10 it") and "done in" in lines[-1]


def test_silenced_progress_writes_nothing(monkeypatch):
    monkeypatch.setenv("TIERSERVE_NO_PROGRESS", "1")
    stream = io.StringIO()
    bar = progress_bar(total=3, file=stream)
    bar.update(3)
    bar.close()
    assert stream.getvalue() == ""


def test_heartbeat_speaks_while_the_block_runs():
    stream = io.StringIO()
    with heartbeat("[demo] loading", file=stream, interval=0.05):
        assert until(lambda: stream.getvalue().count("\n") >= 2, timeout=10)
    said = stream.getvalue().count("\n")
    time.sleep(0.2)  # four of its intervals in which it must stay quiet
    assert stream.getvalue().count("\n") == said  # quiet once the block ended
    assert stream.getvalue().startswith("[demo] loading ... (")


def test_predict_and_evaluate_count_to_the_rows_of_the_data(tmp_path):
    from tierserve.clients.batch_inference import total_rows
    from tierserve.clients.demo_model import generate_data

    data = generate_data(tmp_path, num_samples=1024)
    assert total_rows(data.train.source, "Norm") == data.train.num_samples == 1024
    assert total_rows(data.eval.source, "Norm") == data.eval.num_samples
    assert total_rows(data.eval.source, "Raw") is None
