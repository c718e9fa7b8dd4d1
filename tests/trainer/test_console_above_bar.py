"""Warnings, log lines and prints start on a line of their own while the training bar is drawn, and the bar is
drawn again after them (hybridflow.trainer.tracking.above_bar). The run is a child process, so its console is
the plain one a user has (pytest captures logging and warnings of its own process)."""

from __future__ import annotations

import os
import subprocess
import sys

MESSAGES = ("a logged warning", "a warnings.warn warning", "a printed line", "a warning from a worker thread")

CHILD = f'''
import logging, threading, warnings
from tqdm import tqdm
from hybridflow.trainer.tracking.trackers import Tracking
MESSAGES = {MESSAGES!r}
configured = logging.getLogger("a_library")  # a handler set up before the bar, holding the real stderr
configured.addHandler(logging.StreamHandler())
configured.propagate = False
tracking = Tracking("p", "e", backends=[])
with tracking.progress(total_steps=4):
    tracking.log({{"critic/score/mean": 0.5}}, step=1)
    logging.getLogger("hybridflow.test").warning(MESSAGES[0])
    tracking.log({{}}, step=2)
    warnings.warn(MESSAGES[1], UserWarning)
    print(MESSAGES[2])
    worker = threading.Thread(target=logging.getLogger("hybridflow.test").warning, args=(MESSAGES[3],))
    worker.start()
    worker.join()
    tracking.log({{}}, step=3)
    for _ in tqdm(range(3), desc="writing shards"):  # another bar, drawn on the replaced stderr
        pass
    tqdm.write("a tqdm.write line")
    logging.getLogger("hybridflow.test").warning("after the inner bar")
    configured.warning("from a configured handler")
'''


def console_of_a_run_with_a_bar() -> str:
    """The child's stdout and stderr, as one stream (a log file, or a terminal's scrollback)."""
    env = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                          timeout=120, check=True)
    return done.stdout.decode()


def test_each_message_starts_a_line_and_the_bar_resumes_after_it():
    out = console_of_a_run_with_a_bar()
    lines = out.split("\n")  # a log filter's view: \n-separated lines, whatever \r the bar left in them
    assert MESSAGES[0] in lines and MESSAGES[2] in lines and MESSAGES[3] in lines, out
    assert any(line.endswith(f"UserWarning: {MESSAGES[1]}") and line.startswith("<string>") for line in lines), out
    assert "a tqdm.write line" in lines and "after the inner bar" in lines, out
    assert "from a configured handler" in lines, out
    assert "writing shards: 100%" in out
    # the bar was drawn before the first message and again after the last one
    assert out.index("training:") < out.index(MESSAGES[0]) and out.rindex("training:") > out.rindex(MESSAGES[3]), out
