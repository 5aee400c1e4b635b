"""``tailguard alerts follow``'s lines: a silenced breach is shown, dimmed and marked."""

import json
from typing import Any

from rich.console import Console

from tailguard.alerts.events import decode_event
from tailguard.alerts.follow import event_line


def _plain(markup: str) -> str:
    console = Console(width=300, no_color=True, highlight=False)
    with console.capture() as capture:
        console.print(markup)
    return capture.get()


def test_a_silenced_breach_is_dimmed_and_marked_with_its_silence(make_breach: Any) -> None:
    record = make_breach(silenced=True, silence_id="sil-3f2a")
    line = event_line(decode_event(json.dumps(record).encode(), "breach"))
    assert "[bold red]" not in line, "a silenced breach must not look like a page"
    text = _plain(line)
    assert "[silenced sil-3f2a]" in text and "OPENED" in text
    assert "chat/llama-3.1-8b/default/acme" in text


def test_an_unsilenced_breach_keeps_its_colours_and_has_no_mark(make_breach: Any) -> None:
    line = event_line(decode_event(json.dumps(make_breach(silenced=False)).encode(), "breach"))
    assert "[bold red]" in line and "silenced" not in _plain(line)
