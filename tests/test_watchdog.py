"""The deadline watchdog (runtime/watchdog.py) arms each thread's wait on its own: a wait that ended
is never reported by another thread leaving its guard, and a thread's long wait is reported even
when another thread's guard ended first (the comm thread beside the main thread); a wait with no
name of its own (``wait_all``'s) inside a named one is reported by that name."""
import threading
import time

from hpcreduce.runtime.watchdog import Watchdog


class Recording(Watchdog):
    """A watchdog that records what expired instead of aborting the job."""

    def __init__(self, deadline_s):
        super().__init__(deadline_s, poll_s=0.02)
        self.expired = []

    def _expire(self, what, waited, deadline):
        self.expired.append(what)
        self._armed.clear()


def test_each_thread_arms_its_own_wait():
    dog = Recording(0.4)
    inside, leave = threading.Event(), threading.Event()

    def other(what, hold):
        with dog.guard(what):
            inside.set()
            leave.wait(hold)

    thread = threading.Thread(target=other, args=("the other thread's short wait", 0.2))
    with dog.guard("the main thread's wait"):
        thread.start()
        inside.wait()
    thread.join()
    time.sleep(0.8)  # both ended: nothing may expire
    assert dog.expired == []
    inside.clear()
    thread = threading.Thread(target=other, args=("the other thread's long wait", 5.0))
    with dog.guard("the main thread's wait"):
        thread.start()
        inside.wait()
    time.sleep(0.8)  # the main thread's guard ended first; the other thread still waits
    leave.set()
    thread.join()
    assert dog.expired == ["the other thread's long wait"]


def test_an_unnamed_wait_inside_a_named_one_is_reported_by_that_name():
    dog = Recording(0.3)
    with dog.guard("waiting for the pull_rows of table 't'"):
        with dog.guard(None):
            time.sleep(0.8)
    with dog.guard(None):
        time.sleep(0.8)
    assert list(dict.fromkeys(dog.expired)) == ["waiting for the pull_rows of table 't'", "a wait for messages of peers"]
