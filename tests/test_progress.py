"""Stage timings and progress: timings always kept, bars only when asked for."""

from __future__ import annotations

import logging

from flowsearch.progress import Stages


def test_timings_accumulate_per_stage():
    st = Stages(show=False)
    with st.timed("encode"):
        pass
    with st.timed("encode"):
        pass
    assert set(st.seconds) == {"encode"} and st.seconds["encode"] >= 0


def test_quiet_tasks_and_status_do_nothing_visible(capsys):
    st = Stages(show=False)
    with st.live(), st.task("rows", total=3) as advance, st.status("fitting"):
        advance(3)
    assert capsys.readouterr().err == ""


def test_shown_progress_goes_to_stderr_and_restores_the_logger(capsys):
    st = Stages(show=True)
    logger = logging.getLogger("flowsearch.test_progress")
    level, propagate = logger.level, logger.propagate
    with st.live(), st.task("rows", total=2) as advance:
        advance(2)
        with st.status("fitting", follow="flowsearch.test_progress"):
            logger.info("loss 1.0")
    captured = capsys.readouterr()
    assert captured.out == "" and "rows" in captured.err
    assert (logger.level, logger.propagate) == (level, propagate)
