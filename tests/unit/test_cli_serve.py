"""``vllm-dyno serve`` input errors: a clear message and exit 2, nothing started."""
from __future__ import annotations

import pytest

from app.cli import main


@pytest.mark.parametrize("argv", [["--startup-timeout", "-5"], ["--startup-timeout", "x"], ["--grace", "-1"],
                                  ["--grace", "0"], ["--startup-timeout", "nan"]])
def test_durations_must_be_positive_seconds(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", "--model", "m", "--engine", "sim", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert argv[0] in err and "seconds" in err and "Traceback" not in err


