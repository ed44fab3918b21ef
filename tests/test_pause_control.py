"""PauseControl: the one place paused time is measured and pause/resume reach the running engine."""
from __future__ import annotations

import threading
import time

from h3bridge import PauseControl


def test_listeners_hear_pause_and_resume_in_order_and_repeats_are_refused():
    control = PauseControl()
    heard: list[bool] = []
    remove = control.on_change(heard.append)
    assert control.pause() is True
    assert control.pause() is False          # already paused: no second stop
    assert control.paused
    assert control.resume() is True
    assert control.resume() is False
    assert heard == [True, False]
    remove()
    control.pause()
    assert heard == [True, False]            # a removed listener hears nothing more


def test_a_listener_added_while_paused_hears_the_pause_at_once():
    control = PauseControl()
    control.pause()
    heard: list[bool] = []
    control.on_change(heard.append)
    assert heard == [True]


def test_paused_time_is_left_out_of_active_time():
    control = PauseControl()
    start = time.monotonic()
    control.pause()
    time.sleep(0.3)
    control.resume()
    paused = control.paused_seconds()
    assert paused >= 0.3
    # active time is wall time minus paused time, measured from the same clock
    assert control.active_seconds(start) <= time.monotonic() - start - 0.3 + 1e-6


def test_wait_until_resumed_blocks_while_paused():
    control = PauseControl()
    control.pause()
    assert control.wait_until_resumed(0.05) is False
    released = threading.Event()

    def waiter() -> None:
        control.wait_until_resumed()
        released.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    assert not released.wait(0.1)
    control.resume()
    assert released.wait(10)
    thread.join()
