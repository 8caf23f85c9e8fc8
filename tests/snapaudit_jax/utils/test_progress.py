"""snapaudit_jax.utils.progress: the progress protocol and its printer."""

from __future__ import annotations



from snapaudit_jax.utils import (
    Counter,
    Progress,
    RunLog,
)



def test_progress_printer_follows_the_protocol(capsys, monkeypatch):
    log = RunLog(True)
    assert isinstance(log, Progress) and isinstance(RunLog(False), Progress)
    log("stage one")
    for done in range(0, 101):
        log.bar(done, 100, "prompts")
    err = capsys.readouterr().err
    assert "] stage one\n" in err
    assert err.count("\n") == 2  # one message line, one finished bar
    assert "100/100 new prompts" in err and err.count("\r") < 10  # rate-limited
    quiet = RunLog(False)
    quiet("x")
    quiet.bar(1, 1, "y")
    c = Counter("sim", 10, enabled=False)
    c.update(10)
    assert capsys.readouterr().err == ""
